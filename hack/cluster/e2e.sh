#!/usr/bin/env bash
# make e2e-cluster: the end-to-end test on a real single-node cluster. It
# reuses a running cluster and leaves it running; one it had to start it
# stops again at the end (KEEP_CLUSTER=1 keeps it), pass or fail.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $(id -u) != 0 ]]; then
  echo "make e2e-cluster needs root: a node makes a bridge, iptables chains, mounts and cgroups." >&2
  echo "Run make test as root (CI does), or make test-short for the suites that need no cluster." >&2
  exit 1
fi
bins=$(bash hack/cluster/bins.sh)
tool=$(mktemp -d)/cluster
trap 'rm -rf "$(dirname "$tool")"' EXIT
go build -o "$tool" ./hack/cluster

started=
if ! "$tool" status --bins "$bins" >/dev/null; then
  started=1
fi
access=$("$tool" up --bins "$bins")
echo "$access"
if [[ -n $started && -z ${KEEP_CLUSTER:-} ]]; then
  # Down checks that nothing is left on the host; a leak fails the run.
  trap 'rc=$?; "$tool" down || rc=1; rm -rf "$(dirname "$tool")"; exit $rc' EXIT
fi
"$tool" images --bins "$bins" --tag dev

export EGRESS_PROXIES_CLUSTER_KUBECONFIG=$(sed -n 's/^kubeconfig: //p' <<<"$access")
export EGRESS_PROXIES_CLUSTER_KUBECTL=$(sed -n 's/^kubectl: //p' <<<"$access")
go test ./test/suites/cluster -run TestInstalledAsUsersDeployIt -count=1 -v -timeout 25m ${E2E_FLAGS:-}
