package install

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const ns = "egress-proxies-system"

var chart = filepath.Join(testenv.RepoRoot(), "charts", "egress-proxies")

// helm runs the helm pinned in hack/tools/go.mod.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	home := t.TempDir()
	cmd := exec.Command("go", append([]string{"tool", "helm"}, args...)...)
	cmd.Dir = testenv.RepoRoot()
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(testenv.RepoRoot(), "hack", "tools", "go.work"),
		"HELM_CACHE_HOME="+home, "HELM_CONFIG_HOME="+home, "HELM_DATA_HOME="+home)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func render(t *testing.T, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, append([]string{"template", "ep", chart, "--namespace", ns}, extra...)...)
	require.NoError(t, err, out)
	return decode(t, out)
}

func TestLint(t *testing.T) {
	testenv.Require(t)
	for _, values := range [][]string{nil, {"-f", "testdata/all-on.yaml"}} {
		out, err := helm(t, append([]string{"lint", chart, "--strict"}, abs(values)...)...)
		assert.NoError(t, err, out)
		assert.Contains(t, out, "1 chart(s) linted, 0 chart(s) failed")
	}
}

func abs(values []string) []string {
	out := append([]string(nil), values...)
	for i, v := range out {
		if strings.HasSuffix(v, ".yaml") {
			out[i], _ = filepath.Abs(v)
		}
	}
	return out
}

func TestRenderedObjectsAreAcceptedByAnAPIServer(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	for name, values := range map[string][]string{"defaults": nil, "all options": {"-f", "testdata/all-on.yaml"}} {
		t.Run(name, func(t *testing.T) {
			objs := render(t, abs(values)...)
			kinds := map[string]int{}
			for _, u := range objs {
				kinds[u.GetKind()]++
				if slices.Contains([]string{"ServiceMonitor", "PodMonitor", "PrometheusRule", "Certificate"}, u.GetKind()) {
					continue // prometheus-operator's and cert-manager's CRDs are not installed on envtest
				}
				err := env.Client.Patch(ctx, u, client.Apply, client.DryRunAll, client.FieldOwner("chart-test"), client.ForceOwnership)
				assert.NoError(t, err, "%s %s", u.GetKind(), u.GetName())
			}
			assert.Equal(t, 3, kinds["Deployment"], "controller, prober, broker")
			for _, k := range []string{"ServiceAccount", "ClusterRole", "Role", "ConfigMap", "Service", "PodDisruptionBudget"} {
				assert.Positive(t, kinds[k], k)
			}
			tlsSecrets := 0
			for _, u := range objs {
				if u.GetKind() == "Secret" && u.Object["type"] == "kubernetes.io/tls" {
					tlsSecrets++
				}
			}
			if name == "all options" {
				assert.Equal(t, 2, kinds["Certificate"], "cert-manager issues the probe and broker certificates")
				assert.Zero(t, tlsSecrets, "so the chart makes none")
				assert.Equal(t, 1, kinds["HorizontalPodAutoscaler"])
				assert.Equal(t, 2, kinds["ServiceMonitor"])
				assert.Positive(t, kinds["NetworkPolicy"])
				assert.Zero(t, kinds["StatefulSet"], "external Redis: the chart runs none")
			} else {
				assert.Equal(t, 1, tlsSecrets, "the chart makes the probe certificate")
				assert.Equal(t, 1, kinds["StatefulSet"], "the quick-start Redis")
			}
			for _, u := range objs {
				if u.GetKind() != "Deployment" {
					continue
				}
				pod, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
				sc, _, _ := unstructured.NestedMap(pod, "securityContext")
				assert.Equal(t, true, sc["runAsNonRoot"], "%s runs as non-root", u.GetName())
				c := pod["containers"].([]any)[0].(map[string]any)
				csc := c["securityContext"].(map[string]any)
				assert.Equal(t, true, csc["readOnlyRootFilesystem"], u.GetName())
				assert.Equal(t, false, csc["allowPrivilegeEscalation"], u.GetName())
				assert.NotNil(t, c["livenessProbe"], u.GetName())
				assert.NotNil(t, c["readinessProbe"], u.GetName())
			}
		})
	}
}

func TestRBACIsLeastPrivilege(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	for _, n := range []string{ns, "team-b"} {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}})
	}
	for _, u := range render(t, "--set", "secretNamespaces={team-b}", "--set", "tenants[0].name=team-a", "--set", "tenants[0].namespaces={team-a}") {
		switch u.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			require.NoError(t, env.Client.Patch(ctx, u, client.Apply, client.FieldOwner("chart-test"), client.ForceOwnership), u.GetName())
		}
	}
	type check struct {
		sa, verb, group, resource, sub, namespace string
		allowed                                   bool
		name                                      string
	}
	cases := []check{
		// The prober reads nothing.
		{"ep-prober", "get", "crawl.example.com", "proxies", "", "default", false, ""},
		{"ep-prober", "list", "", "pods", "", ns, false, ""},
		{"ep-prober", "get", "", "secrets", "", ns, false, ""},
		// The broker reads Proxies and writes nothing.
		{"ep-broker", "list", "crawl.example.com", "proxies", "", "", true, ""},
		{"ep-broker", "watch", "crawl.example.com", "proxies", "", "team-a", true, ""},
		{"ep-broker", "update", "crawl.example.com", "proxies", "", "team-a", false, ""},
		{"ep-broker", "patch", "crawl.example.com", "proxies", "status", "team-a", false, ""},
		{"ep-broker", "list", "crawl.example.com", "targetpolicies", "", "", true, ""},
		{"ep-broker", "watch", "crawl.example.com", "targetpolicies", "", "team-a", true, ""},
		{"ep-broker", "update", "crawl.example.com", "targetpolicies", "", "team-a", false, ""},
		{"ep-broker", "create", "events.k8s.io", "events", "", "team-a", false, ""},
		// Secrets read-only, and only in the secretNamespaces listed
		// (team-b here): External proxies' credentials (its cache
		// narrows the watch to those labelled for it). In the release's
		// namespace only the tenants' credentials, by name: never the
		// KVM SSH key or Helm's release Secrets. kube-system's, or any
		// other namespace's, never.
		{"ep-broker", "watch", "", "secrets", "", "team-b", true, ""},
		{"ep-broker", "get", "", "secrets", "", ns, true, "ep-tenant-team-a"},
		{"ep-broker", "get", "", "secrets", "", ns, false, "kvm-ssh"},
		{"ep-broker", "get", "", "secrets", "", ns, false, "sh.helm.release.v1.ep.v1"},
		{"ep-broker", "get", "", "secrets", "", ns, false, "ep-discovery-token"},
		{"ep-broker", "list", "", "secrets", "", ns, false, ""},
		{"ep-broker", "watch", "", "secrets", "", ns, false, ""},
		{"ep-broker", "get", "", "secrets", "", "team-b", true, ""},
		// Tenants: read in the release's namespace, their status written.
		{"ep-broker", "watch", "crawl.example.com", "tenants", "", ns, true, ""},
		{"ep-broker", "patch", "crawl.example.com", "tenants", "status", ns, true, ""},
		{"ep-broker", "update", "crawl.example.com", "tenants", "", ns, false, ""},
		{"ep-broker", "create", "crawl.example.com", "tenants", "", ns, false, ""},
		{"ep-broker", "list", "crawl.example.com", "tenants", "", "team-a", false, ""},
		{"ep-broker", "list", "", "secrets", "", "team-a", false, ""},
		{"ep-broker", "list", "", "secrets", "", "kube-system", false, ""},
		{"ep-broker", "list", "", "secrets", "", "", false, ""},
		{"ep-broker", "create", "", "secrets", "", "team-b", false, ""},
		{"ep-broker", "update", "", "secrets", "", ns, false, ""},
		// The controller: Proxies and their status, its pods, Secrets read-only,
		// Events, its leader Lease; nothing else.
		{"ep-controller", "patch", "crawl.example.com", "proxies", "status", "team-a", true, ""},
		{"ep-controller", "update", "crawl.example.com", "proxies", "", "team-a", true, ""},
		{"ep-controller", "update", "crawl.example.com", "proxies", "finalizers", "team-a", true, ""},
		{"ep-controller", "watch", "", "secrets", "", ns, true, ""},
		{"ep-controller", "watch", "", "secrets", "", "team-b", true, ""},
		{"ep-controller", "list", "", "secrets", "", "team-a", false, ""},
		{"ep-controller", "list", "", "secrets", "", "kube-system", false, ""},
		{"ep-controller", "list", "", "secrets", "", "", false, ""},
		{"ep-controller", "create", "", "secrets", "", "team-a", false, ""},
		{"ep-controller", "update", "", "secrets", "", ns, false, ""},
		{"ep-controller", "delete", "", "secrets", "", ns, false, ""},
		{"ep-controller", "create", "", "pods", "", ns, true, ""},
		{"ep-controller", "create", "", "secrets", "", ns, true, ""}, // a Squid pod's credentials
		// ProxySources: their lists' ConfigMaps read wherever Secrets
		// are; their members' credentials written only in the
		// secretNamespaces, where the brokers read them.
		{"ep-controller", "watch", "", "configmaps", "", ns, true, ""},
		{"ep-controller", "watch", "", "configmaps", "", "team-b", true, ""},
		{"ep-controller", "watch", "", "configmaps", "", "team-a", false, ""},
		{"ep-controller", "update", "", "configmaps", "", "team-b", false, ""},
		{"ep-controller", "delete", "", "secrets", "", "team-b", true, ""},
		{"ep-controller", "patch", "", "secrets", "", "team-b", true, ""},
		{"ep-controller", "delete", "", "secrets", "", "team-a", false, ""},
		{"ep-controller", "watch", "crawl.example.com", "proxysources", "", "team-a", true, ""},
		{"ep-controller", "patch", "crawl.example.com", "proxysources", "status", "team-a", true, ""},
		{"ep-controller", "update", "crawl.example.com", "proxysources", "", "team-a", false, ""},
		{"ep-uninstall", "delete", "crawl.example.com", "proxysources", "", "team-a", true, ""},
		{"ep-controller", "delete", "", "pods", "", ns, true, ""},
		{"ep-controller", "create", "", "pods", "", "team-a", false, ""},
		{"ep-controller", "create", "events.k8s.io", "events", "", "team-a", true, ""},
		{"ep-controller", "update", "coordination.k8s.io", "leases", "", ns, true, ""},
		{"ep-controller", "update", "coordination.k8s.io", "leases", "", "kube-system", false, ""},
		// Leader election's core Events beside its Lease, found missing
		// on a real cluster (envtest has no one to read them).
		{"ep-controller", "create", "", "events", "", ns, true, ""},
		{"ep-controller", "create", "", "events", "", "team-a", false, ""},
		{"ep-controller", "create", "apps", "deployments", "", ns, false, ""},
		{"ep-controller", "patch", "apps", "deployments", "", ns, false, ""},
		{"ep-controller", "list", "", "nodes", "", "", false, ""},
		{"ep-controller", "create", "rbac.authorization.k8s.io", "clusterroles", "", "", false, ""},
		// ProxyPools create and delete their members; a pool's spec is
		// its user's, only its status the controller's.
		{"ep-controller", "create", "crawl.example.com", "proxies", "", "team-a", true, ""},
		{"ep-controller", "delete", "crawl.example.com", "proxies", "", "team-a", true, ""},
		{"ep-controller", "watch", "crawl.example.com", "proxypools", "", "team-a", true, ""},
		{"ep-controller", "patch", "crawl.example.com", "proxypools", "status", "team-a", true, ""},
		{"ep-controller", "update", "crawl.example.com", "proxypools", "", "team-a", false, ""},
		{"ep-controller", "update", "crawl.example.com", "proxypools", "scale", "team-a", true, ""},
		{"ep-broker", "list", "crawl.example.com", "proxypools", "", "team-a", false, ""},
		// The uninstall hook deletes Pools and Proxies, nothing else.
		{"ep-uninstall", "delete", "crawl.example.com", "proxies", "", "team-a", true, ""},
		{"ep-uninstall", "delete", "crawl.example.com", "proxypools", "", "team-a", true, ""},
		{"ep-uninstall", "list", "crawl.example.com", "proxies", "", "", true, ""},
		{"ep-uninstall", "update", "crawl.example.com", "proxies", "", "team-a", false, ""},
		{"ep-uninstall", "delete", "", "pods", "", ns, false, ""},
		{"ep-uninstall", "get", "", "secrets", "", ns, false, ""},
		// The CRD hook applies this chart's CRDs and no other.
		{"ep-crds", "create", "apiextensions.k8s.io", "customresourcedefinitions", "", "", true, ""},
		{"ep-crds", "patch", "apiextensions.k8s.io", "customresourcedefinitions", "", "", true, "proxies.crawl.example.com"},
		{"ep-crds", "get", "apiextensions.k8s.io", "customresourcedefinitions", "", "", true, "targetpolicies.crawl.example.com"},
		{"ep-crds", "patch", "apiextensions.k8s.io", "customresourcedefinitions", "", "", false, "certificates.cert-manager.io"},
		{"ep-crds", "delete", "apiextensions.k8s.io", "customresourcedefinitions", "", "", false, "proxies.crawl.example.com"},
		{"ep-crds", "list", "crawl.example.com", "proxies", "", "", false, ""},
		{"ep-crds", "get", "", "secrets", "", ns, false, ""},
		// ... and the release's Tenants, in its namespace only.
		{"ep-crds", "create", "crawl.example.com", "tenants", "", ns, true, ""},
		{"ep-crds", "delete", "crawl.example.com", "tenants", "", ns, true, ""},
		{"ep-crds", "delete", "crawl.example.com", "tenants", "", "team-a", false, ""},
		{"ep-crds", "patch", "crawl.example.com", "tenants", "status", ns, false, ""},
	}
	for _, c := range cases {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   "system:serviceaccount:" + ns + ":" + c.sa,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: c.namespace, Verb: c.verb, Group: c.group, Resource: c.resource, Subresource: c.sub, Name: c.name},
		}}
		require.NoError(t, env.Client.Create(ctx, sar))
		assert.Equal(t, c.allowed, sar.Status.Allowed, "%s %s %s/%s %s %s in %q", c.sa, c.verb, c.group, c.resource, c.sub, c.name, c.namespace)
	}
}

func TestValuesThatBreakTheSchemaAreNamed(t *testing.T) {
	testenv.Require(t)
	for _, c := range []struct{ set, want string }{
		{"controller.replicas=two", "controller/replicas"},
		{"broker.leaseCap=-1", "broker/leaseCap"},
		{"controller.health.interval=soon", "controller/health/interval"},
		{"prober.replcas=3", "replcas"},
		{"controller.scale.kubeAPIQPS=0", "controller/scale/kubeAPIQPS"},
		{"controller.scale.resyncInterval=often", "controller/scale/resyncInterval"},
		{"auth.probeTLS.source=cert-manager", "auth/probeTLS/issuerRef/name"},
		{"auth.probeTLS.source=self", "auth/probeTLS/source"},
		{"broker.tls.enabled=true", "broker/tls/secretName"},
		{"controller.image.digest=latest", "controller/image/digest"},
		{"controller.extraEnv[0].value=x", "controller/extraEnv/0"},
		{"global.imagePullSecrets[0]=mirror", "global/imagePullSecrets/0"},
		{"controller.health.staleIntervals=1", "controller/health/staleIntervals"},
		{"controller.health.denyCIDRs=metadata", "controller/health/denyCIDRs"},
		{"broker.gateway.port=8090", "broker/gateway/port"},
		{"broker.gateway.leaseTTL=long", "broker/gateway/leaseTTL"},
		{"broker.gateway.service.type=Ingress", "broker/gateway/service/type"},
		{"broker.gateway.maxConns=-1", "broker/gateway/maxConns"},
		{"broker.gateway.capacityWait=soon", "broker/gateway/capacityWait"},
		{"broker.gateway.tls.port=9090", "broker/gateway/tls/port"},
	} {
		out, err := helm(t, "template", "ep", chart, "--set", c.set)
		require.Error(t, err, c.set)
		assert.Contains(t, out, c.want, c.set)
	}
	out, err := helm(t, "template", "ep", chart, "--set", "redis.internal.enabled=false")
	require.Error(t, err)
	assert.Contains(t, out, "redis.external.addrs is required")
	out, err = helm(t, "template", "ep", chart, "--set", "broker.image.repository=")
	require.Error(t, err)
	assert.Contains(t, out, "broker/image/repository")
	for _, c := range []struct {
		set  []string
		want string // "" when it renders
	}{
		{[]string{"broker.gateway.service.type=LoadBalancer"}, "would travel in the clear"},
		{[]string{"broker.gateway.service.type=NodePort"}, "would travel in the clear"},
		{[]string{"broker.gateway.service.type=LoadBalancer", "broker.gateway.allowPlaintextOutsideCluster=true"}, ""},
		{[]string{"broker.gateway.tls.enabled=true"}, "broker.gateway.tls.enabled needs broker.tls.enabled"},
		{[]string{"broker.gateway.service.type=LoadBalancer", "broker.gateway.tls.enabled=true", "broker.tls.enabled=true", "broker.tls.secretName=t"}, ""},
		// The release namespace's Secrets (the KVM key, the tokens, Helm's
		// releases) are never opened up to the brokers and the controller.
		{[]string{"secretNamespaces={crawl,default}"}, "secretNamespaces lists the release namespace default"},
		{[]string{"secretNamespaces={crawl}"}, ""},
	} {
		args := []string{"template", "ep", chart}
		for _, s := range c.set {
			args = append(args, "--set", s)
		}
		out, err := helm(t, args...)
		if c.want == "" {
			assert.NoError(t, err, "%v: %s", c.set, out)
			continue
		}
		require.Error(t, err, "%v", c.set)
		assert.Contains(t, out, c.want, "%v", c.set)
	}
}
