package install

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// The CRDs reach a cluster through a pre-install and pre-upgrade hook
// that runs the controller's image with --apply-crds on a ConfigMap of
// the generated CRDs (services/controller/pkg/crds applies them and is
// tested against an API server there). Rendered as release objects, they
// were owned by the release, and an install in another namespace after
// an uninstall was refused (found by make e2e-cluster).
func TestCRDsAreAppliedByAHookNotOwnedByTheRelease(t *testing.T) {
	objs := render(t)
	for _, u := range objs {
		assert.NotEqual(t, "CustomResourceDefinition", u.GetKind(), "no CRD is a release object: %s", u.GetName())
	}
	hooks := map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		if u.GetName() == "ep-crds" {
			hooks[u.GetKind()] = u
			assert.Equal(t, "pre-install,pre-upgrade", u.GetAnnotations()["helm.sh/hook"], "%s", u.GetKind())
			assert.Equal(t, "before-hook-creation,hook-succeeded", u.GetAnnotations()["helm.sh/hook-delete-policy"], "%s", u.GetKind())
		}
	}
	for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Job"} {
		require.Contains(t, hooks, k)
		if k != "Job" {
			assert.Less(t, hooks[k].GetAnnotations()["helm.sh/hook-weight"], hooks["Job"].GetAnnotations()["helm.sh/hook-weight"], "%s exists before the Job runs", k)
		}
	}

	// The ConfigMap holds exactly the generated CRDs.
	data, _, _ := unstructured.NestedStringMap(hooks["ConfigMap"].Object, "data")
	files, err := filepath.Glob(filepath.Join(testenv.CRDDir(), "*.yaml"))
	require.NoError(t, err)
	require.Len(t, data, len(files))
	for _, f := range files {
		want, err := os.ReadFile(f)
		require.NoError(t, err)
		assert.Equal(t, string(want), data[filepath.Base(f)], filepath.Base(f))
	}
	job := podSpec(t, hooks["Job"])
	assert.Equal(t, "ep-crds", job.ServiceAccountName)
	c := job.Containers[0]
	assert.Contains(t, c.Args, "--apply-crds=/etc/egress-proxies/crds")
	assert.True(t, strings.HasSuffix(c.Image, "egress-proxies-controller:0.1.0"), c.Image)
	require.Len(t, c.VolumeMounts, 2)
	assert.Equal(t, "/etc/egress-proxies/crds", c.VolumeMounts[0].MountPath)
	assert.Equal(t, "ep-crds", job.Volumes[0].ConfigMap.Name)

	// Then the release's Tenants, from a ConfigMap of their own (the CRD
	// directory holds only CRDs): none declared is an empty list, which
	// deletes any the release made before.
	assert.Subset(t, c.Args, []string{"--apply-tenants=/etc/egress-proxies/tenants/tenants.yaml", "--tenant-namespace=" + ns, "--release=ep"})
	assert.Equal(t, "/etc/egress-proxies/tenants", c.VolumeMounts[1].MountPath)
	assert.Equal(t, "ep-tenants", job.Volumes[1].ConfigMap.Name)
	tenants := find(t, objs, "ConfigMap", "ep-tenants")
	assert.Equal(t, "pre-install,pre-upgrade", tenants.GetAnnotations()["helm.sh/hook"])
	assert.Less(t, tenants.GetAnnotations()["helm.sh/hook-weight"], hooks["Job"].GetAnnotations()["helm.sh/hook-weight"])
	list, _, _ := unstructured.NestedString(tenants.Object, "data", "tenants.yaml")
	assert.Equal(t, "[]", list)
	declared := find(t, render(t, "--set", "tenants[0].name=team-a", "--set", "tenants[0].namespaces={crawl-a}", "--set", "tenants[0].quotas.gatewayBytesPerDay=50Gi",
		"--set", "tenants[0].verbs={gateway}"), "ConfigMap", "ep-tenants")
	list, _, _ = unstructured.NestedString(declared.Object, "data", "tenants.yaml")
	assert.YAMLEq(t, `- metadata: {name: team-a}
  spec:
    credentials: [{name: ep-tenant-team-a}]
    namespaces: [crawl-a]
    verbs: [gateway]
    quotas: {gatewayBytesPerDay: 50Gi}
`, list)

	for _, u := range render(t, "--set", "crds.enabled=false") {
		assert.NotEqual(t, "ep-crds", u.GetName(), "crds.enabled=false renders no CRD hook (%s)", u.GetKind())
	}
}
