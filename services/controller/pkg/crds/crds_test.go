package crds_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/crds"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestLoadNamesWhatIsNotACRD(t *testing.T) {
	dir := t.TempDir()
	_, err := crds.Load(dir)
	assert.ErrorContains(t, err, "no .yaml file in "+dir)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n"), 0o644))
	_, err = crds.Load(dir)
	assert.ErrorContains(t, err, "a.yaml holds a v1 ConfigMap, not an apiextensions.k8s.io/v1 CustomResourceDefinition")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("{{"), 0o644))
	_, err = crds.Load(dir)
	assert.ErrorContains(t, err, "a.yaml")
}

func TestTheGeneratedCRDsLoad(t *testing.T) {
	defs, err := crds.Load(testenv.CRDDir())
	require.NoError(t, err)
	var names []string
	for _, d := range defs {
		names = append(names, d.GetName())
	}
	assert.Equal(t, []string{"proxies.crawl.example.com", "proxypools.crawl.example.com", "proxysources.crawl.example.com", "targetpolicies.crawl.example.com", "tenants.crawl.example.com"}, names)
}

// An upgrade's hook applies a changed schema over one another manager
// (Helm, when the CRDs were chart templates) applied: played on a copy of
// the Proxy CRD under a group of its own, so the suite's CRD stays as it
// is. The previous CRD lacks spec.healthCheck; applying the new one adds
// it, and objects stored before are still served.
func TestApplyUpgradesASchemaOwnedByAnotherManager(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	defs, err := crds.Load(testenv.CRDDir())
	require.NoError(t, err)
	const group = "upgrade.crawl.example.com"
	crd := func(withHealthCheck bool) *unstructured.Unstructured {
		u := defs[0].DeepCopy()
		u.SetName("proxies." + group)
		require.NoError(t, unstructured.SetNestedField(u.Object, group, "spec", "group"))
		if !withHealthCheck {
			versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
			unstructured.RemoveNestedField(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "healthCheck")
			require.NoError(t, unstructured.SetNestedSlice(u.Object, versions, "spec", "versions"))
		}
		return u
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, crd(true)) })
	old := crd(false)
	require.NoError(t, env.Client.Patch(ctx, old, client.Apply, client.FieldOwner("helm"), client.ForceOwnership))
	log := slog.New(slog.DiscardHandler)
	require.NoError(t, crds.Apply(ctx, env.Client, log, []*unstructured.Unstructured{crd(false)}), "re-applying the same schema")

	ns := env.Namespace(t, "crd-upgrade")
	gvk := schema.GroupVersionKind{Group: group, Version: "v1alpha1", Kind: "Proxy"}
	proxy := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec": map[string]any{"mode": "External", "address": "127.0.0.1", "port": int64(3128),
				"healthCheck": map[string]any{"intervalSeconds": int64(45)}},
		}}
		u.SetGroupVersionKind(gvk)
		return u
	}
	interval := func(name string) (int64, bool) {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
			return 0, false
		}
		v, found, _ := unstructured.NestedInt64(u.Object, "spec", "healthCheck", "intervalSeconds")
		return v, found
	}
	require.Eventually(t, func() bool { return env.Client.Create(ctx, proxy("before")) == nil }, 30*time.Second, 100*time.Millisecond)
	_, found := interval("before")
	assert.False(t, found, "the previous schema prunes the field it does not know")

	require.NoError(t, crds.Apply(ctx, env.Client, log, []*unstructured.Unstructured{crd(true)}))
	// The API server takes up a new schema a moment after the write: a
	// new object is tried until one keeps the field.
	kept := false
	for i := 0; !kept && i < 300; i++ {
		name := fmt.Sprintf("after-%d", i)
		if err := env.Client.Create(ctx, proxy(name)); err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		got, found := interval(name)
		if kept = found && got == 45; !kept {
			time.Sleep(100 * time.Millisecond)
		}
	}
	require.True(t, kept, "the upgraded schema keeps the new field")
	_, found = interval("before")
	assert.False(t, found, "an object stored before the upgrade is still served")

	var got unstructured.Unstructured
	got.SetGroupVersionKind(old.GroupVersionKind())
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: old.GetName()}, &got))
	managers := map[string]bool{}
	for _, f := range got.GetManagedFields() {
		managers[f.Manager] = true
	}
	assert.True(t, managers[crds.FieldOwner], "the hook owns the fields it applied: %v", managers)
}

func TestApplyNamesACRDThatIsNeverEstablished(t *testing.T) {
	testenv.Require(t)
	defs, err := crds.Load(testenv.CRDDir())
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, crds.Apply(ctx, env.Client, slog.New(slog.DiscardHandler), defs), "the suite's CRDs, applied again, are Established at once")

	// A second CRD claiming the Proxy kind in the same group: the API
	// server never accepts its names.
	clash := defs[0].DeepCopy()
	clash.SetName("widgets.crawl.example.com")
	require.NoError(t, unstructured.SetNestedField(clash.Object, "widgets", "spec", "names", "plural"))
	require.NoError(t, unstructured.SetNestedField(clash.Object, "widget", "spec", "names", "singular"))
	unstructured.RemoveNestedField(clash.Object, "spec", "names", "shortNames")
	t.Cleanup(func() { _ = env.Client.Delete(ctx, clash) })
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	err = crds.Apply(short, env.Client, slog.New(slog.DiscardHandler), []*unstructured.Unstructured{clash})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CRD widgets.crawl.example.com")
	assert.Contains(t, err.Error(), "NamesAccepted")
}
