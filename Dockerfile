# One Dockerfile for the three services: build from the repository root
# with the service as a build argument,
#   docker build --build-arg SERVICE=broker --build-arg GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t egress-proxies-broker .
# (`make docker-build` builds all three). The binary is static
# (CGO_ENABLED=0) on a distroless base with no shell, running as nonroot.
FROM golang:1.26 AS build
ARG SERVICE
RUN case "$SERVICE" in controller|prober|broker) ;; \
      *) echo "build argument SERVICE must be controller, prober or broker, not '$SERVICE'" >&2; exit 1;; esac
WORKDIR /src
COPY . .
ARG GIT_COMMIT=unknown
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/egress-proxies/egress-proxies/pkg/version.Commit=${GIT_COMMIT}" \
      -o /out/service ./services/${SERVICE}/cmd/${SERVICE}

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/service /service
USER 65532:65532
ENTRYPOINT ["/service"]
