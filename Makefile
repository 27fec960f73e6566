# egress-proxies: the controller, the prober fleet and the lease broker.
# `make help` lists the targets. Every tool runs through `go tool` from
# hack/tools/go.mod; nothing is assumed installed beyond Go, make and apt.

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

MODULES := pkg services/controller services/prober services/broker clients/kubectl-egress hack/demo hack/cluster test
GO_PKGS := $(addsuffix /...,$(addprefix ./,$(MODULES)))
# Tools live in a module of their own, outside go.work.
TOOL := GOWORK=$(CURDIR)/hack/tools/go.work go tool
# controller-gen loads our packages, so it must run in our workspace: `go
# tool -n` builds it from the tools module and prints its path.
CONTROLLER_GEN = GOWORK= $$($(TOOL) -n controller-gen)
BIN ?= $(CURDIR)/bin
IMG ?= egress-proxies
TAG ?= dev
GIT_COMMIT ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
LDFLAGS := -s -w -X github.com/egress-proxies/egress-proxies/pkg/version.Commit=$(GIT_COMMIT)
# Debian packages the tests run for real: Redis, Squid, and for the kvm
# providers' hosts libvirtd with its qemu driver, qemu, sshd, and bsdtar to
# read the seed ISOs back. Recursive (=): the client and cluster lists are
# defined below it.
APT_PACKAGES = redis-server squid openssh-server libvirt-daemon libvirt-daemon-driver-qemu qemu-system-x86 qemu-utils libarchive-tools iproute2 \
  chromium $(CLIENT_APT_PACKAGES) $(CLUSTER_APT_PACKAGES)
# The Python client's suite runs on Debian's Python and its packages (no
# Python registry is needed), and the clients' code is generated with
# Debian's protoc and gRPC Python plugin (libprotobuf-dev holds the
# well-known types the protos import). Node.js and npm are the machine's.
# curl and requests are the gateway suite's clients.
CLIENT_APT_PACKAGES := python3-grpcio python3-protobuf python3-scrapy python3-pytest python3-setuptools python3-wheel \
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev python3-requests curl
PYTHON ?= /usr/bin/python3
# The real cluster: iptables for kube-proxy, the kubelet and the pods'
# isolation; libseccomp and pkg-config to build runc; and what the images
# made from Debian's packages hold (Squid and Redis above, curl, busybox
# for their shells, the CA roots).
CLUSTER_APT_PACKAGES := iptables libseccomp-dev pkg-config busybox-static curl ca-certificates redis-tools squid-langpack
TEST_FLAGS ?= -race -count=1 -timeout 20m

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-16s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Run

.PHONY: demo
# The demo installs only what it runs (not the tests' hypervisors, browser
# or cluster tools), while the API server it needs builds.
DEMO_APT_PACKAGES := redis-server squid
# Compiled into the build cache while the API server builds (a warm-up:
# its errors, if any, are the demo's own to report).
DEMO_SERVICES := ./services/controller/cmd/controller ./services/prober/cmd/prober ./services/broker/cmd/broker

demo: ## Run the whole system on loopback and walk the quickstart (Ctrl-C stops; DEMO_FLAGS=--once exits after the walk).
	@echo "demo: installing $(DEMO_APT_PACKAGES) if missing, building the API server (first run only) and compiling the services, side by side"
	@$(MAKE) --no-print-directory deps APT_PACKAGES="$(DEMO_APT_PACKAGES)" & apt=$$!; \
	go build ./hack/demo $(DEMO_SERVICES) 2>/dev/null & warm=$$!; \
	assets=$$(bash hack/envtest-bins.sh); built=$$?; wait $$warm; wait $$apt && [ $$built = 0 ] || exit 1; \
	echo "demo: starting the system"; \
	KUBEBUILDER_ASSETS=$$assets go run ./hack/demo $(DEMO_FLAGS)

RUN_DEV_REDIS ?= 127.0.0.1:6379
RUN_DEV_PROVIDERS ?=

.PHONY: run-dev
run-dev: build ## Run the three services locally against the current kubeconfig context (Redis at RUN_DEV_REDIS).
	@echo "controller, one prober and one broker against $$(kubectl config current-context 2>/dev/null || echo 'the current kubeconfig context'); Ctrl-C stops all"
	@trap 'kill 0' EXIT INT TERM; \
	$(BIN)/controller --leader-elect=false --probe-addr 127.0.0.1:9443 --probe-insecure --metrics-bind-address 127.0.0.1:8080 --health-probe-bind-address 127.0.0.1:8081 $(if $(RUN_DEV_PROVIDERS),--providers-config $(RUN_DEV_PROVIDERS)) & \
	$(BIN)/prober --controller-addr 127.0.0.1:9443 --controller-insecure --ops-addr 127.0.0.1:8082 & \
	$(BIN)/broker --redis-addrs $(RUN_DEV_REDIS) --grpc-addr 127.0.0.1:9090 --http-addr 127.0.0.1:8090 --ops-addr 127.0.0.1:8083 & \
	wait

##@ Development

.PHONY: generate
generate: manifests ## Regenerate protobuf/gRPC/gateway code, the OpenAPI document, deepcopy, CRDs, the generated docs (status writers, CRD field reference, Redis keys) and the Python and Node clients' code.
	$(TOOL) buf generate
	cd pkg && $(CONTROLLER_GEN) object paths=./api/...
	cd pkg && go run ./api/ownersdoc ../docs/api/status-writers.md
	cd pkg && go run ./api/crddoc ../deploy/crds ../docs/api/reference
	cd services/broker && go run ./pkg/store/keysdoc ../../docs/components/broker.md
	cd test && go run ./framework/suitesdoc .. ../docs/testing.md
	bash clients/gen.sh

.PHONY: manifests
manifests: ## Regenerate the CRD YAML in deploy/crds and the chart's crds/ (one source) from pkg/api.
	cd pkg && $(CONTROLLER_GEN) crd:allowDangerousTypes=true paths=./api/... output:crd:artifacts:config=../deploy/crds
	cp deploy/crds/*.yaml charts/egress-proxies/files/crds/

GENERATED := pkg/gen pkg/openapi/gen deploy/crds charts/egress-proxies/files/crds pkg/api/v1alpha1/zz_generated.deepcopy.go docs/api docs/components/broker.md docs/testing.md \
  clients/python/egress_proxies/_gen clients/node/src/gen

.PHONY: verify-generated
verify-generated: ## Fail if generated files differ from what `make generate` writes; it generates into a scratch copy, never the working tree.
	@scratch=$$(mktemp -d); trap 'rm -rf "$$scratch"' EXIT; \
	git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$$scratch" 2>/dev/null || true; \
	ln -s $(CURDIR)/clients/node/node_modules "$$scratch/clients/node/node_modules"; \
	$(MAKE) --no-print-directory -C "$$scratch" generate >/dev/null; \
	stale=; for g in $(GENERATED); do \
	  diff -r "$$g" "$$scratch/$$g" >/dev/null 2>&1 || stale="$$stale $$g"; done; \
	if [ -n "$$stale" ]; then echo "stale generated files:$$stale; run make generate, review and commit them"; exit 1; fi; \
	echo "generated files are in sync"

.PHONY: lint
lint: ## go vet in every module, gofmt, buf lint.
	go vet $(GO_PKGS)
	@out=$$(gofmt -l pkg services clients/kubectl-egress hack/demo hack/cluster test); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(TOOL) buf lint

.PHONY: breaking
breaking: ## buf breaking against main.
	$(TOOL) buf breaking --against '.git#branch=main'

.PHONY: build
build: ## Build the three services and the kubectl plugin (bin/kubectl-egress: copy it onto PATH) as static binaries (CGO_ENABLED=0) into bin/.
	@mkdir -p $(BIN)
	for s in controller prober broker; do \
	  CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/$$s ./services/$$s/cmd/$$s; done
	CGO_ENABLED=0 go build -trimpath -o $(BIN)/kubectl-egress ./clients/kubectl-egress

.PHONY: krew
krew: ## The kubectl plugin's archives for linux and darwin (amd64, arm64) and krew's manifest naming them, into bin/krew (KREW_URL: where they will be served).
	bash hack/krew.sh

.PHONY: docker-build
docker-build: ## Build the three images $(IMG)-{controller,prober,broker}:$(TAG) (needs a Docker engine).
	for s in controller prober broker; do \
	  docker build --build-arg SERVICE=$$s --build-arg GIT_COMMIT=$(GIT_COMMIT) -t $(IMG)-$$s:$(TAG) .; done

HELM := GOWORK=$(CURDIR)/hack/tools/go.work go tool helm
# The images docker-build tags, as the chart's values.
CHART_IMAGES := --set image.registry= --set image.tag=$(TAG) \
  $(foreach s,controller prober broker,--set $(s).image.repository=$(IMG)-$(s))
DEPLOY_NS ?= egress-proxies-system

.PHONY: install
install: ## Install the CRD into the current cluster.
	kubectl apply --server-side -f deploy/crds/

.PHONY: deploy
deploy: install ## Plain manifests, no Helm release: render the chart and kubectl apply it (IMG, TAG as for docker-build; needs openssl).
	kubectl create namespace $(DEPLOY_NS) --dry-run=client -o yaml | kubectl apply -f -
	bash hack/deploy-secrets.sh $(DEPLOY_NS) egress-proxies
	$(HELM) template egress-proxies charts/egress-proxies --namespace $(DEPLOY_NS) $(CHART_IMAGES) -f hack/deploy-values.yaml --no-hooks \
	  | kubectl apply --server-side -f -

.PHONY: helm-install
helm-install: ## helm upgrade --install from charts/ (IMG, TAG as for docker-build).
	$(HELM) upgrade --install egress-proxies charts/egress-proxies --namespace $(DEPLOY_NS) --create-namespace $(CHART_IMAGES)

.PHONY: undeploy
undeploy: ## Remove what deploy applied (Proxies first, so their instances are cleaned up).
	-kubectl delete proxies --all --all-namespaces --wait
	$(HELM) template egress-proxies charts/egress-proxies --namespace $(DEPLOY_NS) -f hack/deploy-values.yaml --no-hooks | kubectl delete --ignore-not-found -f -

.PHONY: kvm-ssh-secret
KVM_SSH_KEY ?= $(HOME)/.ssh/proxy-operator_ed25519
KVM_KNOWN_HOSTS ?= $(HOME)/.ssh/kvm_known_hosts
kvm-ssh-secret: ## Create the kvm-ssh Secret from KVM_SSH_KEY and KVM_KNOWN_HOSTS.
	kubectl -n $(DEPLOY_NS) create secret generic kvm-ssh --from-file=id_ed25519=$(KVM_SSH_KEY) --from-file=known_hosts=$(KVM_KNOWN_HOSTS)

##@ Test

.PHONY: deps
deps: ## Install the Debian packages the tests use (as root), or say which to install.
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "the tests need:$$missing. Run: sudo apt-get install -y$$missing"; exit 1; fi; fi
	@# libvirtd's qemu driver refuses to start without the account Debian's
	@# libvirt-daemon-system would create (the tests' hosts run qemu as root).
	@if [ "$$(id -u)" = 0 ] && ! getent passwd libvirt-qemu >/dev/null; then useradd -r -M -s /usr/sbin/nologin libvirt-qemu; fi

.PHONY: envtest
envtest: ## Build (once, cached) kube-apiserver and etcd for envtest.
	@bash hack/envtest-bins.sh >/dev/null

.PHONY: test
test: deps envtest node-deps verify-generated lint ## Everything: set-up, generated-code drift, lint, unit + envtest + process suites with -race, the Python and Node clients' suites, then the real-cluster end-to-end test.
	KUBEBUILDER_ASSETS=$$(bash hack/envtest-bins.sh) go test $(TEST_FLAGS) $(GO_PKGS)
	$(MAKE) --no-print-directory test-clients
	$(MAKE) --no-print-directory e2e-cluster

.PHONY: node-deps
node-deps: ## Install the Node client's and the crawlee example's packages (npm ci, from their lock files).
	@command -v npm >/dev/null || { echo "the Node client needs Node.js 20+ and npm"; exit 1; }
	cd clients/node && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build
	cd examples/crawlee && npm ci --no-audit --no-fund --loglevel=error

.PHONY: test-clients
test-clients: test-python test-node ## The Python and Node clients' suites and the Scrapy and crawlee examples, each against the whole system on loopback.

CLIENTENV := $(BIN)/clientenv

.PHONY: clientenv
clientenv: envtest
	cd hack/demo && go build -o $(CLIENTENV) ./clientenv

.PHONY: test-python
test-python: deps clientenv ## The Python client's suite (Debian's python3 and packages) and examples/scrapy.
	cd clients/python && KUBEBUILDER_ASSETS=$$(bash ../../hack/envtest-bins.sh) CLIENTENV=$(CLIENTENV) $(PYTHON) -m pytest -q -p no:cacheprovider

.PHONY: test-node
test-node: node-deps clientenv ## The Node client's suite and examples/crawlee.
	cd clients/node && KUBEBUILDER_ASSETS=$$(bash ../../hack/envtest-bins.sh) CLIENTENV=$(CLIENTENV) node test/run.mjs

.PHONY: test-short
test-short: ## Unit tests only (no API server, no outside processes, no cluster).
	go test -short $(GO_PKGS)

##@ Real cluster

# The cluster's binaries, built once and cached (hack/cluster/bins.sh).
CLUSTER_BINS = $$(bash hack/cluster/bins.sh)
CLUSTER := go run ./hack/cluster

.PHONY: cluster-bins
cluster-bins: ## Build (once, cached) Kubernetes, etcd, containerd, runc, the CNI plugins, CoreDNS and local-path-provisioner from source.
	@bash hack/cluster/bins.sh >/dev/null

.PHONY: cluster-up
cluster-up: deps cluster-bins ## Start a single-node cluster on this machine (as root; reuses a running one) and print its kubeconfig and kubectl.
	$(CLUSTER) up --bins $(CLUSTER_BINS)

.PHONY: cluster-images
cluster-images: ## Build the project's images (services, Squid, Redis, curl, e2e programs) and load them into the running cluster.
	$(CLUSTER) images --bins $(CLUSTER_BINS) --tag $(TAG)

.PHONY: images
images: ## Write an install's images (the services, Squid, Redis, curl) as OCI archives into bin/images, no Docker needed: import them on each node (ctr -n k8s.io images import) or copy them to a registry (skopeo copy oci-archive:...).
	$(CLUSTER) save --out bin/images --tag $(TAG)

.PHONY: cluster-down
cluster-down: ## Stop the cluster and remove everything it made on the host (processes, bridge, iptables, mounts, cgroups, state).
	$(CLUSTER) down

.PHONY: e2e-cluster
e2e-cluster: deps cluster-bins ## The end-to-end test on a real cluster: helm install, a ProxyPool of Squid pods, a crawler pod, scaling, faults, upgrade, broker TLS, uninstall (starts a cluster if none runs, and stops it after).
	bash hack/cluster/e2e.sh

##@ Benchmarks

.PHONY: bench-broker
bench-broker: deps envtest ## Leases/s and p50/p99 over gRPC and REST (64 clients, 1,000 proxies, real Redis) against the Lua script's own ceiling, and ban-aware leasing against --ban-aware=false.
	KUBEBUILDER_ASSETS=$$(bash hack/envtest-bins.sh) go test ./test/suites/broker -run '^$$' -bench BenchmarkLeases -benchtime 1x -timeout 10m

.PHONY: bench-gateway
bench-gateway: deps envtest ## The proxy gateway against straight Squid, a minimal relay and proxy-chain, same run, same Squid and site: throughput, new tunnels per request at 64 clients (profiled), a 100 MiB download, time to first byte, 10,000 idle tunnels and their renewal, the lease API's p99 under a connection flood, leaked leases; SOAK=10m adds the soak.
	@if command -v npm >/dev/null; then npm ci --prefix hack/bench/proxy-chain --no-audit --no-fund --silent; else echo "no npm: the bench runs without proxy-chain"; fi
	EGRESS_PROXIES_SOAK=$(SOAK) KUBEBUILDER_ASSETS=$$(bash hack/envtest-bins.sh) go test ./test/suites/broker -run '^$$' -bench BenchmarkGateway -benchtime 1x -timeout $(if $(SOAK),3h,15m)

.PHONY: bench-console
bench-console: deps envtest ## The web console in headless Chromium with N proxies (CONSOLE_N=10000): first full render against the REST page calls it makes, a live update's time to screen against the REST watch, same run.
	CONSOLE_N=$(CONSOLE_N) KUBEBUILDER_ASSETS=$$(bash hack/envtest-bins.sh) go test ./test/suites/broker -run '^$$' -bench BenchmarkConsole -benchtime 1x -timeout 30m

.PHONY: bench-prober
bench-prober: deps ## Probes/s and CPU per probe of one prober against Squid-fronted HTTPS targets, against a minimal CONNECT loop in the same run, and memory for 10,000 assigned proxies.
	go test ./services/prober/pkg/agent -run '^$$' -bench BenchmarkProber -benchtime 1x -timeout 5m

N ?= 1000
INTERVAL ?=
TIMEOUT ?=
CONSOLE_N ?= 10000

.PHONY: bench-pool
bench-pool: deps envtest ## A ProxyPool of N (POOL_N=1000) against N Proxies created directly, same run, same reconcilers: time to all Ready and Healthy, and the ratio.
	KUBEBUILDER_ASSETS=$$(bash hack/envtest-bins.sh) go test -run '^$$' -bench BenchmarkPoolBringUp -benchtime 1x -timeout 30m ./services/controller/pkg/controllers/proxypool/

.PHONY: bench-fleet
bench-fleet: deps envtest ## The whole system with N External Proxies (N=1000 at a 2s interval; N=10000 at 30s): bring-up time against the probe schedule's bound, API writes, steady writes, RSS and CPU per process, a killed prober's share, REST latency.
	KUBEBUILDER_ASSETS=$$(bash hack/envtest-bins.sh) FLEET_N=$(N) FLEET_INTERVAL=$(INTERVAL) FLEET_TIMEOUT=$(TIMEOUT) \
	  go test ./test/suites/fleet -run '^$$' -bench BenchmarkFleet -benchtime 1x -timeout 60m
