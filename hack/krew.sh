#!/usr/bin/env bash
# make krew: kubectl-egress archives for each platform and the krew
# manifest naming them (deploy/krew/egress.yaml.tmpl), into bin/krew.
# KREW_URL is where the archives will be served from; VERSION their
# version (v0.0.0-<commit> by default).
set -euo pipefail
cd "$(dirname "$0")/.."
out=bin/krew
url=${KREW_URL:-https://github.com/egress-proxies/egress-proxies/releases/download/${VERSION:-latest}}
version=${VERSION:-v0.0.0-$(git rev-parse --short=12 HEAD 2>/dev/null || echo dev)}
rm -rf "$out" && mkdir -p "$out"
platforms=
for p in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
  os=${p%/*} arch=${p#*/}
  dir=$(mktemp -d)
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build -trimpath -ldflags '-s -w' -o "$dir/kubectl-egress" ./clients/kubectl-egress
  cp LICENSE "$dir/" 2>/dev/null || true
  tarball=kubectl-egress_${os}_${arch}.tar.gz
  tar -C "$dir" -czf "$out/$tarball" .
  rm -rf "$dir"
  sum=$(sha256sum "$out/$tarball" | cut -d' ' -f1)
  platforms+="  - selector: {matchLabels: {os: $os, arch: $arch}}
    uri: $url/$tarball
    sha256: $sum
    bin: kubectl-egress
"
done
VERSION=$version PLATFORMS=${platforms%$'\n'} envsubst '${VERSION} ${PLATFORMS}' < deploy/krew/egress.yaml.tmpl > "$out/egress.yaml"
echo "wrote $out/egress.yaml and its archives"
