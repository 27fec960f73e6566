package framework

import (
	"os"
	"testing"
)

// The real cluster a suite runs on: `make e2e-cluster` (hack/cluster)
// brings one up and sets these.
const (
	EnvClusterKubeconfig = "EGRESS_PROXIES_CLUSTER_KUBECONFIG"
	EnvClusterKubectl    = "EGRESS_PROXIES_CLUSTER_KUBECTL"
)

// Cluster is the real cluster's kubeconfig and the kubectl built for it;
// without them, or with -short, the test is skipped (make test-short, go
// test ./... outside make).
func Cluster(t *testing.T) (kubeconfig, kubectl string) {
	t.Helper()
	kubeconfig, kubectl = os.Getenv(EnvClusterKubeconfig), os.Getenv(EnvClusterKubectl)
	if kubeconfig == "" || kubectl == "" || testing.Short() {
		t.Skipf("needs a real cluster: make e2e-cluster sets %s and %s", EnvClusterKubeconfig, EnvClusterKubectl)
	}
	return kubeconfig, kubectl
}
