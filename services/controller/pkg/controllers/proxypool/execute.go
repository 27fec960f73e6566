package proxypool

import (
	"context"
	"errors"
	"maps"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// execute carries out cmd through the pool's member set: the members'
// in-place sync, then deletes, drains and creates, each waited for in the
// cache so the next reconcile decides on a view that holds it, and the
// retry-count resets. It decides nothing.
func (r *Reconciler) execute(ctx context.Context, pool *v1.ProxyPool, hash string, l limits, o *observed, cmd plan, now time.Time) error {
	set := &memberset.Set{Client: r.client, Recorder: r.recorder, Owner: pool, Wait: true, Workers: r.opts.CreateWorkers,
		Done: func(a memberset.Action, cause string) { decisions.WithLabelValues(string(a), cause).Inc() }}
	errs := []error{r.syncInPlace(ctx, set, pool, o)}
	p := memberset.Plan{DrainUntil: memberset.DrainDeadline(now, l.drainTimeout), Create: creations(pool, hash, o.taken, cmd.creates)}
	for _, name := range cmd.delete {
		v := cmd.verdicts[name]
		p.Delete = append(p.Delete, memberset.Change{Member: o.proxies[name], Why: v.why, Cause: string(v.cause)})
	}
	for _, name := range cmd.drain {
		v := cmd.verdicts[name]
		p.Drain = append(p.Drain, memberset.Change{Member: o.proxies[name], Why: v.why, Cause: string(v.cause)})
	}
	errs = append(errs, set.Apply(ctx, p))
	// A member healthy long enough has shown its slot works.
	for _, name := range cmd.recovered {
		errs = append(errs, set.Update(ctx, o.proxies[name], func(px *v1.Proxy) { delete(px.Annotations, v1.AnnotationSlotRetries) }))
	}
	return errors.Join(errs...)
}

// desiredMeta returns px's labels and annotations with the template's
// applied; keys the template does not name are kept.
func desiredMeta(pool *v1.ProxyPool, px *v1.Proxy) (map[string]string, map[string]string) {
	labels := maps.Clone(px.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, pool.Spec.Template.Metadata.Labels)
	labels[v1.LabelPool] = pool.Name
	annotations := maps.Clone(px.Annotations)
	if len(pool.Spec.Template.Metadata.Annotations) > 0 && annotations == nil {
		annotations = map[string]string{}
	}
	maps.Copy(annotations, pool.Spec.Template.Metadata.Annotations)
	return labels, annotations
}

// syncInPlace brings every member's mutable part (attributes, health
// check, template labels and annotations) to the template's.
func (r *Reconciler) syncInPlace(ctx context.Context, set *memberset.Set, pool *v1.ProxyPool, o *observed) error {
	t := &pool.Spec.Template.Spec
	var errs []error
	for _, px := range o.proxies {
		if !px.DeletionTimestamp.IsZero() || inPlaceCurrent(pool, px) {
			continue
		}
		errs = append(errs, set.Update(ctx, px, func(next *v1.Proxy) {
			next.Labels, next.Annotations = desiredMeta(pool, px)
			next.Spec.Attributes, next.Spec.HealthCheck = t.Attributes, t.HealthCheck
		}))
	}
	return errors.Join(errs...)
}

// inPlaceCurrent reports whether px's mutable part is the template's. It
// runs for every member on every reconcile, so it compares in place
// rather than building the desired maps.
func inPlaceCurrent(pool *v1.ProxyPool, px *v1.Proxy) bool {
	t := &pool.Spec.Template
	if px.Labels[v1.LabelPool] != pool.Name || !contains(px.Labels, t.Metadata.Labels) || !contains(px.Annotations, t.Metadata.Annotations) ||
		!maps.Equal(t.Spec.Attributes, px.Spec.Attributes) {
		return false
	}
	a, b := t.Spec.HealthCheck, px.Spec.HealthCheck
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// contains reports whether every pair of sub is in m.
func contains(m, sub map[string]string) bool {
	for k, v := range sub {
		if got, ok := m[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// creations are the members to create, under the lowest free names
// <pool>-<ordinal>. The names follow from the cache alone, so a retry on
// the same view asks for the same names and gets AlreadyExists.
func creations(pool *v1.ProxyPool, hash string, taken map[string]bool, cs []creation) []memberset.Change {
	out := make([]memberset.Change, 0, len(cs))
	for i := 0; len(out) < len(cs); i++ {
		name := pool.Name + "-" + strconv.Itoa(i)
		if taken[name] {
			continue
		}
		c := cs[len(out)]
		out = append(out, memberset.Change{Member: newMember(pool, name, hash, c), Why: c.why, Cause: string(c.cause)})
	}
	return out
}

// newMember is a member made from the pool's template; the set makes it
// the pool's as it creates it, so no Proxy of the pool exists unowned.
func newMember(pool *v1.ProxyPool, name, hash string, c creation) *v1.Proxy {
	t := pool.Spec.Template
	px := &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: pool.Namespace},
		Spec: v1.ProxySpec{
			Mode: v1.ModeManaged, Provider: t.Spec.Provider, Placement: t.Spec.Placement, CloudInit: t.Spec.CloudInit,
			Port: t.Spec.Port, Attributes: t.Spec.Attributes, HealthCheck: t.Spec.HealthCheck,
		},
	}
	px.Labels, px.Annotations = desiredMeta(pool, px)
	px.Labels[v1.LabelTemplateHash] = hash
	if c.replaces != "" {
		if px.Annotations == nil {
			px.Annotations = map[string]string{}
		}
		px.Annotations[v1.AnnotationReplaces] = c.replaces
		if c.retries > 0 {
			px.Annotations[v1.AnnotationSlotRetries] = strconv.Itoa(c.retries)
		}
	}
	return px
}
