# Sourced by hack/envtest-bins.sh and hack/cluster/bins.sh: writes a
# scratch module that can build k8s.io/kubernetes commands outside
# kubernetes' own tree. k8s.io/kubernetes points every staging module at
# ./staging/src/...; a module built elsewhere must point them at the
# published versions. Both scripts write the same go.mod, so their builds
# share Go's build cache: the cluster's binaries reuse every package the
# envtest API server compiled.
k8s_module() {
  local dir=$1 version=$2
  mkdir -p "$dir"
  local kgomod
  kgomod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "module k8sbuild"
    echo "go 1.26"
    echo "require k8s.io/kubernetes v$version"
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/' "$kgomod" |
      sed -E "s#^\s*(k8s\.io/[a-z0-9-]+) => .*#replace \1 => \1 v0.${version#1.}#"
  } >"$dir/go.mod"
  # Every command the callers build, so one go.sum serves them all.
  {
    echo 'package main'
    for c in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
      echo "import _ \"k8s.io/kubernetes/cmd/$c\""
    done
  } >"$dir/tools.go"
  (cd "$dir" && { go mod tidy >&2 2>&1 || go mod tidy; })
}
