package tenanthook_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/tenanthook"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`
- metadata: {name: team-a}
  spec: {credentials: [{name: ep-tenant-team-a}], namespaces: [crawl-a], quotas: {maxLeases: 50}}
`), 0o600))
	got, err := tenanthook.Load(path)
	require.NoError(t, err)
	require.Len(t, got, 1)
	assert.Equal(t, "team-a", got[0].Name)
	assert.Equal(t, ptr.To[int32](50), got[0].Spec.Quotas.MaxLeases)

	require.NoError(t, os.WriteFile(path, []byte("- metadata: {name: a}\n  spec: {namespace: [x]}\n"), 0o600))
	_, err = tenanthook.Load(path)
	assert.ErrorContains(t, err, `unknown field "namespace"`, "a misspelt field is named, not dropped")
	require.NoError(t, os.WriteFile(path, []byte("- spec: {namespaces: [x]}\n"), 0o600))
	_, err = tenanthook.Load(path)
	assert.ErrorContains(t, err, "tenant 0 has no metadata.name")
}

func declared(names ...string) []v1.Tenant {
	var out []v1.Tenant
	for _, n := range names {
		out = append(out, v1.Tenant{ObjectMeta: metav1.ObjectMeta{Name: n},
			Spec: v1.TenantSpec{Credentials: []v1.TenantCredential{{Name: "ep-tenant-" + n}}, Namespaces: []string{"crawl-" + n}}})
	}
	return out
}

func names(t *testing.T, ns string) []string {
	t.Helper()
	var list v1.TenantList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	var out []string
	for _, tn := range list.Items {
		out = append(out, tn.Name)
	}
	return out
}

// An upgrade applies what the values declare and deletes the release's
// Tenants they no longer do, leaving others' alone; a Tenant the API
// server refuses fails the hook, naming it.
func TestSyncAppliesAndPrunesTheReleasesTenants(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ns := env.Namespace(t, "hook")
	mine := tenanthook.Sync
	require.NoError(t, mine(ctx, env.Client, slog.Default(), ns, "ep", declared("a", "b")))
	byHand := declared("by-hand")[0]
	byHand.Namespace = ns
	require.NoError(t, env.Client.Create(ctx, &byHand))
	assert.ElementsMatch(t, []string{"a", "b", "by-hand"}, names(t, ns))

	next := declared("b")
	next[0].Spec.Quotas.MaxLeases = ptr.To[int32](7)
	require.NoError(t, mine(ctx, env.Client, slog.Default(), ns, "ep", next))
	assert.ElementsMatch(t, []string{"b", "by-hand"}, names(t, ns), "a is no longer declared: revoked")
	var b v1.Tenant
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "b"}, &b))
	assert.Equal(t, ptr.To[int32](7), b.Spec.Quotas.MaxLeases)
	assert.Equal(t, "ep", b.Labels[tenanthook.ReleaseLabel])

	bad := declared("c")
	bad[0].Spec.Namespaces = []string{"Not A Namespace"}
	err := mine(ctx, env.Client, slog.Default(), ns, "ep", bad)
	assert.ErrorContains(t, err, "applying Tenant "+ns+"/c")
	assert.ErrorContains(t, err, "spec.namespaces[0]")
}
