package install

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// The CRDs are templates, so `helm upgrade` applies a changed schema (a
// chart's crds/ directory is installed once and never upgraded). Played
// here on a copy of the Proxy CRD under a group of its own, so the suite's
// CRD stays as it is: the previous chart's CRD lacks spec.healthCheck, and
// applying the new chart's adds it for objects already stored.
func TestAnUpgradeAddsAField(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	rendered := find(t, render(t), "CustomResourceDefinition", "proxies.crawl.example.com")
	assert.Equal(t, "keep", rendered.GetAnnotations()["helm.sh/resource-policy"], "uninstall keeps the CRDs, and so every Proxy")
	for _, u := range render(t, "--set", "crds.enabled=false") {
		assert.NotEqual(t, "CustomResourceDefinition", u.GetKind(), "crds.enabled=false renders none")
	}

	const group = "upgrade.crawl.example.com"
	crd := func(withHealthCheck bool) *unstructured.Unstructured {
		u := rendered.DeepCopy()
		u.SetName("proxies." + group)
		require.NoError(t, unstructured.SetNestedField(u.Object, group, "spec", "group"))
		if !withHealthCheck {
			versions, _, _ := unstructured.NestedSlice(u.Object, "spec", "versions")
			unstructured.RemoveNestedField(versions[0].(map[string]any), "schema", "openAPIV3Schema", "properties", "spec", "properties", "healthCheck")
			require.NoError(t, unstructured.SetNestedSlice(u.Object, versions, "spec", "versions"))
		}
		return u
	}
	apply := func(u *unstructured.Unstructured) {
		require.NoError(t, env.Client.Patch(ctx, u, client.Apply, client.FieldOwner("helm"), client.ForceOwnership))
		require.Eventually(t, func() bool {
			var got apiextensionsv1.CustomResourceDefinition
			if env.Client.Get(ctx, client.ObjectKey{Name: u.GetName()}, &got) != nil {
				return false
			}
			for _, c := range got.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return true
				}
			}
			return false
		}, 30*time.Second, 50*time.Millisecond)
	}
	t.Cleanup(func() { _ = env.Client.Delete(ctx, crd(true)) })
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

	apply(crd(false))
	require.Eventually(t, func() bool { return env.Client.Create(ctx, proxy("before")) == nil }, 30*time.Second, 100*time.Millisecond)
	_, found := interval("before")
	assert.False(t, found, "the previous schema prunes the field it does not know")

	apply(crd(true))
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
}
