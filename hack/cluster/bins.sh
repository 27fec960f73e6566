#!/usr/bin/env bash
# Builds everything a single-node cluster needs from module source, because
# no release download, node image or container registry is reachable here:
# the Kubernetes binaries (one `go build`, so they share compiled packages,
# and the same scratch module as the envtest API server, so they reuse its
# build cache), etcd (the envtest build), containerd, runc, the CNI plugins,
# CoreDNS and local-path-provisioner. Each is cached outside the
# repository, keyed by version; only the first run on a machine pays for it
# (about 20 minutes on 2 cores).
#
# Prints the directory holding every binary on stdout; progress goes to
# stderr.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=${K8S_VERSION:-1.36.3}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.4.2}
RUNC_VERSION=${RUNC_VERSION:-1.5.3}
CNI_VERSION=${CNI_VERSION:-1.10.0}
COREDNS_VERSION=${COREDNS_VERSION:-1.14.7}
LPP_VERSION=${LPP_VERSION:-0.0.30}
CACHE=${EGRESS_PROXIES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies}
ROOT="$CACHE/cluster"
OUT="$ROOT/bin/k8s-$K8S_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION-cni-$CNI_VERSION-coredns-$COREDNS_VERSION-lpp-$LPP_VERSION"

BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl
  etcd containerd ctr containerd-shim-runc-v2 runc bridge host-local loopback portmap
  coredns local-path-provisioner)

complete() {
  local b
  for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done
}
if complete; then
  echo "$OUT"
  exit 0
fi

# Each build stands alone: a scratch module outside the repository's
# go.work, so none of these dependency graphs mixes into ours.
export GOWORK=off GOFLAGS=-mod=mod
mkdir -p "$ROOT"
work=$(mktemp -d "$ROOT/build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# built <component dir> <binaries...>: true when all are already built.
built() {
  local dir=$1 b
  shift
  for b in "$@"; do [[ -x "$dir/$b" ]] || return 1; done
}

# scratch <name> <require...>: a module requiring the given module@versions.
scratch() {
  local dir="$work/$1" r
  shift
  mkdir -p "$dir"
  {
    echo "module build/$(basename "$dir")"
    echo "go 1.26"
    for r in "$@"; do echo "require ${r%@*} ${r#*@}"; done
  } >"$dir/go.mod"
  echo "$dir"
}

build_k8s() {
  local dir="$ROOT/k8s-$K8S_VERSION"
  built "$dir" kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl && return
  echo "cluster: building Kubernetes v$K8S_VERSION (6 binaries, one go build; about 12 min on 2 cores)..." >&2
  # shellcheck source=../k8s-module.sh
  source "$HERE/../k8s-module.sh"
  k8s_module "$work/k8s" "$K8S_VERSION"
  local minor=${K8S_VERSION#1.}
  minor=${minor%%.*}
  # Without the version ldflags a node reports v0.0.0-master and kubectl
  # warns of skew on every call.
  local v=k8s.io/component-base/version
  (cd "$work/k8s" && go build -trimpath -gcflags=all=-dwarf=false -o "$work/k8s/out/" \
    -ldflags "-s -w -X $v.gitVersion=v$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl) >&2
  mkdir -p "$dir"
  mv "$work/k8s/out/"* "$dir/"
}

# build_cmds <name> <module@version> <cgo> <tags> <ldflags> <package...>:
# builds the packages' commands (each named as its last path element)
# from a scratch module into $ROOT/<name>, unless they are there.
build_cmds() {
  local name=$1 req=$2 cgo=$3 tags=$4 ldflags=$5 p s
  shift 5
  local dir="$ROOT/$name" bins=()
  for p in "$@"; do bins+=("$(basename "$p")"); done
  built "$dir" "${bins[@]}" && return
  echo "cluster: building $name (${bins[*]})..." >&2
  s=$(scratch "$name" "$req")
  { echo 'package main'; for p in "$@"; do echo "import _ \"$p\""; done; } >"$s/tools.go"
  # tidy complains that the imports are programs, and writes go.sum all the same.
  (cd "$s" && { go mod tidy >/dev/null 2>&1 || true; } &&
    CGO_ENABLED=$cgo go build -trimpath -gcflags=all=-dwarf=false -tags "$tags" -ldflags "-s -w $ldflags" -o "$s/out/" "$@") >&2
  mkdir -p "$dir"
  mv "$s/out/"* "$dir/"
}

build_containerd() {
  local m=github.com/containerd/containerd/v2
  build_cmds "containerd-$CONTAINERD_VERSION" "$m@v$CONTAINERD_VERSION" 0 no_btrfs "-X $m/version.Version=v$CONTAINERD_VERSION" \
    "$m/cmd/containerd" "$m/cmd/ctr" "$m/cmd/containerd-shim-runc-v2"
}

# runc needs cgo for libseccomp (Debian's libseccomp-dev, make deps).
build_runc() {
  build_cmds "runc-$RUNC_VERSION" "github.com/opencontainers/runc@v$RUNC_VERSION" 1 seccomp "-X main.version=$RUNC_VERSION" \
    github.com/opencontainers/runc
}

build_cni() {
  local m=github.com/containernetworking/plugins
  build_cmds "cni-$CNI_VERSION" "$m@v$CNI_VERSION" 0 "" "" \
    "$m/plugins/main/bridge" "$m/plugins/main/loopback" "$m/plugins/ipam/host-local" "$m/plugins/meta/portmap"
}

build_coredns() {
  local dir="$ROOT/coredns-$COREDNS_VERSION"
  built "$dir" coredns && return
  echo "cluster: building CoreDNS v$COREDNS_VERSION (the plugins a cluster uses; about 2 min)..." >&2
  local s
  s=$(scratch coredns "github.com/coredns/coredns@v$COREDNS_VERSION")
  # CoreDNS's own main links every plugin (cloud DNS SDKs among them); a
  # cluster's Corefile uses these, in CoreDNS's plugin.cfg order. No
  # forward: cluster DNS answers the cluster's own names and nothing else.
  cat >"$s/main.go" <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func init() {
	dnsserver.Directives = []string{"reload", "ready", "health", "errors", "log", "loadbalance", "cache", "kubernetes", "loop"}
}

func main() { coremain.Run() }
GO
  (cd "$s" && go mod tidy >&2 && CGO_ENABLED=0 go build -trimpath -gcflags=all=-dwarf=false -o "$s/coredns" -ldflags "-s -w" .) >&2
  mkdir -p "$dir"
  mv "$s/coredns" "$dir/"
}

build_lpp() {
  local m=github.com/rancher/local-path-provisioner
  build_cmds "local-path-provisioner-$LPP_VERSION" "$m@v$LPP_VERSION" 0 "" "-X main.VERSION=v$LPP_VERSION" "$m"
}

build_k8s
build_containerd
build_runc
build_cni
build_coredns
build_lpp
etcd_dir=$(bash "$HERE/../envtest-bins.sh")

# One directory of links, named by every version, for the cluster to run.
mkdir -p "$OUT.tmp"
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do ln -sf "$ROOT/k8s-$K8S_VERSION/$b" "$OUT.tmp/$b"; done
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "$ROOT/containerd-$CONTAINERD_VERSION/$b" "$OUT.tmp/$b"; done
for b in bridge host-local loopback portmap; do ln -sf "$ROOT/cni-$CNI_VERSION/$b" "$OUT.tmp/$b"; done
ln -sf "$ROOT/runc-$RUNC_VERSION/runc" "$OUT.tmp/runc"
ln -sf "$ROOT/coredns-$COREDNS_VERSION/coredns" "$OUT.tmp/coredns"
ln -sf "$ROOT/local-path-provisioner-$LPP_VERSION/local-path-provisioner" "$OUT.tmp/local-path-provisioner"
ln -sf "$etcd_dir/etcd" "$OUT.tmp/etcd"
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
echo "$OUT"
