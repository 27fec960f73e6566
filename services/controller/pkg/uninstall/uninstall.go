// Package uninstall empties the cluster of what the controller manages
// before its release is removed: every ProxyPool and ProxySource, then
// every Proxy, and
// waits until the Proxies are gone. The controller still runs while it
// waits (it is a Helm pre-delete hook), so each Proxy's finalizer deletes
// its instance through the provider that made it; removing the release
// first would leave VMs running with nobody to delete them.
package uninstall

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Cleaner deletes what the controller manages and waits for it to go.
type Cleaner struct {
	Client client.Client
	Log    *slog.Logger
	// Timeout bounds the wait for every Proxy's instance to be deleted.
	Timeout time.Duration
	// Poll is how often the remaining Proxies are counted.
	Poll time.Duration
}

// LeftError says which Proxies outlived the timeout, and what to do.
type LeftError struct {
	Left    int
	Timeout time.Duration
	Sample  []string
}

func (e *LeftError) Error() string {
	return fmt.Sprintf("%d Proxies still exist %s after they were deleted (%s): their instances are not yet deleted, and uninstalling now would leave them running with nobody to delete them. "+
		"Check `kubectl get proxies -A` and the controller's logs; fix what blocks their providers, or annotate a Proxy %s=true to abandon its instance; then uninstall again",
		e.Left, e.Timeout, strings.Join(e.Sample, ", "), v1.AnnotationSkipCleanup)
}

// Run deletes every ProxyPool and ProxySource first (each would replace
// the members it loses), then every Proxy, and returns once no Proxy is
// left, or a *LeftError at the timeout.
func (c *Cleaner) Run(ctx context.Context) error {
	pools, err := deleteAll(ctx, c.Client, &v1.ProxyPoolList{}, "ProxyPool")
	if err != nil {
		return err
	}
	sources, err := deleteAll(ctx, c.Client, &v1.ProxySourceList{}, "ProxySource")
	if err != nil {
		return err
	}
	var proxies v1.ProxyList
	if err := c.Client.List(ctx, &proxies); err != nil {
		return fmt.Errorf("listing Proxies: %w", err)
	}
	for i := range proxies.Items {
		px := &proxies.Items[i]
		if err := c.Client.Delete(ctx, px); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting Proxy %s/%s: %w", px.Namespace, px.Name, err)
		}
	}
	c.Log.Info("deleted every ProxyPool, ProxySource and Proxy; waiting for their instances to be deleted", "pools", pools, "sources", sources, "proxies", len(proxies.Items), "timeout", c.Timeout)

	deadline := time.Now().Add(c.Timeout)
	for {
		if err := c.Client.List(ctx, &proxies); err != nil {
			return fmt.Errorf("listing Proxies: %w", err)
		}
		if len(proxies.Items) == 0 {
			c.Log.Info("no Proxy is left")
			return nil
		}
		if time.Now().After(deadline) {
			sample := make([]string, 0, 5)
			for _, px := range proxies.Items[:min(5, len(proxies.Items))] {
				sample = append(sample, fmt.Sprintf("%s/%s (%s)", px.Namespace, px.Name, readyReason(&px)))
			}
			slices.Sort(sample)
			return &LeftError{Left: len(proxies.Items), Timeout: c.Timeout, Sample: sample}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(c.Poll):
		}
	}
}

// deleteAll deletes every object of list's kind and counts them; a kind
// the API server does not serve (CRDs of an older release) has none.
func deleteAll(ctx context.Context, c client.Client, list client.ObjectList, kind string) (int, error) {
	if err := c.List(ctx, list); err != nil {
		if meta.IsNoMatchError(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("listing %ss: %w", kind, err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return 0, err
	}
	for _, o := range items {
		obj := o.(client.Object)
		if err := c.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return 0, fmt.Errorf("deleting %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return len(items), nil
}

func readyReason(px *v1.Proxy) string {
	if c := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionReady); c != nil {
		return c.Reason
	}
	return string(px.Status.Phase)
}
