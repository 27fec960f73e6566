package proxypool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/drain"
)

// execute carries out cmd: the members' in-place sync, then deletes,
// drains, retry-count resets and creates, each waited for in the cache so
// the next reconcile decides on a view that holds it. It decides nothing.
func (r *Reconciler) execute(ctx context.Context, pool *v1.ProxyPool, hash string, l limits, o *observed, cmd Command, now time.Time) error {
	errs := []error{r.syncInPlace(ctx, pool, o)}
	for _, name := range cmd.delete {
		v := cmd.verdicts[name]
		errs = append(errs, counted(ActionDelete, v.cause, r.deleteMember(ctx, pool, o.proxies[name], v.why)))
	}
	deadline := drain.Deadline(now, l.drainTimeout)
	for _, name := range cmd.drain {
		v := cmd.verdicts[name]
		errs = append(errs, counted(ActionDrain, v.cause, r.drainMember(ctx, pool, o.proxies[name], deadline, v.why)))
	}
	for _, name := range cmd.recovered {
		errs = append(errs, r.resetRetries(ctx, o.proxies[name]))
	}
	errs = append(errs, r.createMembers(ctx, pool, hash, o.taken, cmd.creates))
	return errors.Join(errs...)
}

// resetRetries restarts the retry count of a member's slot: it has been
// healthy long enough to show the slot works.
func (r *Reconciler) resetRetries(ctx context.Context, px *v1.Proxy) error {
	next := px.DeepCopy()
	delete(next.Annotations, v1.AnnotationSlotRetries)
	if err := client.IgnoreNotFound(r.client.Patch(ctx, next, client.MergeFrom(px))); err != nil {
		return fmt.Errorf("restarting the retry count of member %s: %w", px.Name, err)
	}
	return nil
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
func (r *Reconciler) syncInPlace(ctx context.Context, pool *v1.ProxyPool, o *observed) error {
	t := &pool.Spec.Template.Spec
	var errs []error
	for _, px := range o.proxies {
		if !px.DeletionTimestamp.IsZero() {
			continue
		}
		if inPlaceCurrent(pool, px) {
			continue
		}
		next := px.DeepCopy()
		next.Labels, next.Annotations = desiredMeta(pool, px)
		next.Spec.Attributes, next.Spec.HealthCheck = t.Attributes, t.HealthCheck
		if err := client.IgnoreNotFound(r.client.Patch(ctx, next, client.MergeFrom(px))); err != nil {
			errs = append(errs, fmt.Errorf("updating member %s in place: %w", px.Name, err))
		}
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

// drainMember marks px draining until deadline: brokers stop leasing it
// and end its leases' renewals there.
func (r *Reconciler) drainMember(ctx context.Context, pool *v1.ProxyPool, px *v1.Proxy, deadline time.Time, why string) error {
	next, err := drain.Begin(ctx, r.client, px, deadline)
	if err != nil {
		return fmt.Errorf("member %s: %w", px.Name, err)
	}
	r.recorder.Eventf(pool, next, v1.EventType(v1.EventMemberDraining), v1.EventMemberDraining, "Drain",
		"member %s drains until %s: %s", px.Name, deadline.UTC().Format(time.RFC3339), why)
	return r.waitForCache(ctx, client.ObjectKeyFromObject(px), func(c *v1.Proxy) bool {
		if c == nil {
			return true
		}
		_, ok := c.Annotations[v1.AnnotationDrainDeadline]
		return ok
	})
}

func (r *Reconciler) deleteMember(ctx context.Context, pool *v1.ProxyPool, px *v1.Proxy, why string) error {
	uid := px.UID
	if err := r.client.Delete(ctx, px, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting member %s: %w", px.Name, err)
	}
	r.recorder.Eventf(pool, px, v1.EventType(v1.EventMemberDeleted), v1.EventMemberDeleted, "Delete", "member %s deleted: %s", px.Name, why)
	return r.waitForCache(ctx, client.ObjectKeyFromObject(px), func(c *v1.Proxy) bool { return c == nil || !c.DeletionTimestamp.IsZero() })
}

// createMembers creates members under the lowest free names
// <pool>-<ordinal>. The names follow from the cache alone, so a retry on
// the same view asks for the same names and gets AlreadyExists.
func (r *Reconciler) createMembers(ctx context.Context, pool *v1.ProxyPool, hash string, taken map[string]bool, cs []creation) error {
	if len(cs) == 0 {
		return nil
	}
	names := make([]string, 0, len(cs))
	for i := 0; len(names) < len(cs); i++ {
		name := pool.Name + "-" + strconv.Itoa(i)
		if !taken[name] {
			names = append(names, name)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.opts.CreateWorkers)
	var mu sync.Mutex
	// written: names that exist now (created, or already there); whys:
	// the created ones, for the Event.
	var written, whys []string
	for i, name := range names {
		g.Go(func() error {
			px, err := r.newMember(pool, name, hash, cs[i])
			if err != nil {
				return err
			}
			err = r.client.Create(gctx, px)
			if err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("creating member %s: %w", name, err)
			}
			mu.Lock()
			defer mu.Unlock()
			written = append(written, name)
			if err == nil {
				whys = append(whys, name+" "+cs[i].why)
				decisions.WithLabelValues(string(ActionCreate), string(cs[i].cause)).Inc()
			}
			return nil
		})
	}
	err := g.Wait()
	// The creates went out together; now the cache must hold what they
	// wrote (it gets them in order, so the first waits for most of them).
	for _, name := range written {
		key := client.ObjectKey{Namespace: pool.Namespace, Name: name}
		err = errors.Join(err, r.waitForCache(ctx, key, func(c *v1.Proxy) bool { return c != nil }))
	}
	if len(whys) > 0 {
		sort.Strings(whys)
		r.recorder.Eventf(pool, nil, v1.EventType(v1.EventMemberCreated), v1.EventMemberCreated, "Create",
			"created %d members: %s", len(whys), strings.Join(whys, "; "))
	}
	return err
}

func (r *Reconciler) newMember(pool *v1.ProxyPool, name, hash string, c creation) (*v1.Proxy, error) {
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
	// The ownerReference goes in with the object, so no Proxy of the pool
	// ever exists unowned.
	if err := controllerutil.SetControllerReference(pool, px, r.client.Scheme()); err != nil {
		return nil, err
	}
	return px, nil
}

// cacheWait bounds how long a write may take to reach the cache.
const cacheWait = 10 * time.Second

// waitForCache polls the cache until ok holds for the Proxy (nil when
// absent), so the next reconcile decides on a view that holds this one's
// writes.
func (r *Reconciler) waitForCache(ctx context.Context, key client.ObjectKey, ok func(*v1.Proxy) bool) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, cacheWait, true, func(ctx context.Context) (bool, error) {
		px := &v1.Proxy{}
		err := r.client.Get(ctx, key, px)
		switch {
		case apierrors.IsNotFound(err):
			return ok(nil), nil
		case err != nil:
			last = err
			return false, nil
		}
		return ok(px), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the cache to see member %s: %w", key.Name, errors.Join(err, last))
	}
	return nil
}
