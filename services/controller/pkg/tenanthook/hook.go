// Package tenanthook applies the Tenants a Helm release declares in its
// values: the chart's pre-install and pre-upgrade hook runs the
// controller's image with --apply-tenants on a file of them.
//
// A release cannot render Tenants itself: Helm maps every object of a
// release before its first hook runs, and the Tenant CRD is applied by
// that hook (package crds), so a first install would be refused. Applied
// by the same hook, after the CRDs, the Tenants exist before the brokers
// start; labelled with the release, those a later upgrade no longer
// declares are deleted, so taking a tenant out of the values revokes it.
package tenanthook

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// FieldOwner is the server-side apply manager of the fields the hook
// sets; fields others set (a kubectl edit of a quota) are theirs until
// the next upgrade takes them back.
const FieldOwner = "egress-proxies-chart"

// ReleaseLabel marks the Tenants a release declared, with its name.
const ReleaseLabel = "crawl.example.com/chart-release"

// Load reads a YAML list of Tenants (their metadata.name and spec).
func Load(path string) ([]v1.Tenant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var list []v1.Tenant
	if err := yaml.UnmarshalStrict(b, &list); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for i, t := range list {
		if t.Name == "" {
			return nil, fmt.Errorf("%s: tenant %d has no metadata.name", path, i)
		}
	}
	return list, nil
}

// Sync makes the Tenants of namespace labelled for release exactly
// declared: each applied server-side (the API server validates it, and
// an invalid one fails the hook, naming it), then every other one of the
// release's deleted.
func Sync(ctx context.Context, c client.Client, log *slog.Logger, namespace, release string, declared []v1.Tenant) error {
	keep := map[string]bool{}
	for _, t := range declared {
		t := t.DeepCopy()
		t.TypeMeta = metav1.TypeMeta{APIVersion: v1.GroupVersion.String(), Kind: "Tenant"}
		t.Namespace, t.ResourceVersion = namespace, ""
		if t.Labels == nil {
			t.Labels = map[string]string{}
		}
		t.Labels[ReleaseLabel] = release
		t.Status = v1.TenantStatus{}
		if err := c.Patch(ctx, t, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying Tenant %s/%s: %w", namespace, t.Name, err)
		}
		keep[t.Name] = true
		log.Info("applied", "tenant", t.Name)
	}
	var have v1.TenantList
	if err := c.List(ctx, &have, client.InNamespace(namespace), client.MatchingLabels{ReleaseLabel: release}); err != nil {
		return fmt.Errorf("listing the release's Tenants: %w", err)
	}
	for i := range have.Items {
		t := &have.Items[i]
		if keep[t.Name] {
			continue
		}
		if err := c.Delete(ctx, t); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting Tenant %s/%s, no longer declared: %w", namespace, t.Name, err)
		}
		log.Info("deleted: no longer declared", "tenant", t.Name)
	}
	return nil
}
