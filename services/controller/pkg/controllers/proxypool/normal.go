package proxypool

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// Defaults of the pool's optional fields, as the CRD also declares them.
var (
	defaultMaxSurge       = intstr.FromInt32(1)
	defaultMaxUnavailable = intstr.FromInt32(0)
	defaultDisruption     = intstr.FromString("10%")
	defaultMaxUnhealthy   = intstr.FromString("40%")
)

const (
	defaultDrainTimeout     = 10 * time.Minute
	defaultStartupTimeout   = 15 * time.Minute
	defaultUnhealthyTimeout = 10 * time.Minute
	defaultMaxRetries       = 5
	defaultRetryBackoff     = 30 * time.Second
	maxRetryBackoff         = time.Hour
)

func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d != nil {
		return d.Duration
	}
	return def
}

// resolve turns the pool's spec into counts. Percentages of surge and the
// disruption budget round up and maxUnavailable down, as a Deployment's
// do; when both rollout bounds come to 0 maxUnavailable becomes 1, so a
// rollout can always move.
func resolve(pool *v1.ProxyPool, settle time.Duration) (limits, error) {
	l := limits{replicas: 1, settle: settle, drainTimeout: defaultDrainTimeout}
	if pool.Spec.Replicas != nil {
		l.replicas = int(*pool.Spec.Replicas)
	}
	surge, unavailable, budget := &defaultMaxSurge, &defaultMaxUnavailable, &defaultDisruption
	if s := pool.Spec.Strategy; s != nil {
		surge = cmpOr(s.MaxSurge, surge)
		unavailable = cmpOr(s.MaxUnavailable, unavailable)
	}
	if d := pool.Spec.Disruption; d != nil {
		budget = cmpOr(d.MaxUnavailable, budget)
	}
	var err error
	var errs []error
	l.surge, err = intstr.GetScaledValueFromIntOrPercent(surge, l.replicas, true)
	errs = append(errs, field("spec.strategy.maxSurge", err))
	l.unavailable, err = intstr.GetScaledValueFromIntOrPercent(unavailable, l.replicas, false)
	errs = append(errs, field("spec.strategy.maxUnavailable", err))
	l.budget, err = intstr.GetScaledValueFromIntOrPercent(budget, l.replicas, true)
	errs = append(errs, field("spec.disruption.maxUnavailable", err))
	if l.surge == 0 && l.unavailable == 0 {
		l.unavailable = 1
	}
	l.budget = max(l.budget, 1)
	l.drainTimeout = durationOr(pool.Spec.DrainTimeout, defaultDrainTimeout)

	rem := pool.Spec.Remediation
	if rem == nil {
		rem = &v1.Remediation{}
	}
	l.startupTimeout = durationOr(rem.StartupTimeout, defaultStartupTimeout)
	l.unhealthyTimeout = durationOr(rem.UnhealthyTimeout, defaultUnhealthyTimeout)
	l.backoffBase, l.backoffMax = durationOr(rem.RetryBackoff, defaultRetryBackoff), maxRetryBackoff
	l.maxRetries = defaultMaxRetries
	if rem.MaxRetries != nil {
		l.maxRetries = int(*rem.MaxRetries)
	}
	l.maxUnhealthy, err = intstr.GetScaledValueFromIntOrPercent(cmpOr(rem.MaxUnhealthy, &defaultMaxUnhealthy), l.replicas, true)
	errs = append(errs, field("spec.remediation.maxUnhealthy", err))
	l.distinctEgressIPs = pool.Spec.DistinctEgressIPs
	return l, errors.Join(errs...)
}

func cmpOr(v, d *intstr.IntOrString) *intstr.IntOrString {
	if v != nil {
		return v
	}
	return d
}

func field(name string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// templateHash hashes what makes an instance: a member whose hash differs
// from its pool's is replaced. Attributes and health checks are not in
// it; they change in place.
func templateHash(t *v1.ProxyTemplateSpec) string {
	b, _ := json.Marshal(struct {
		Provider  string
		Placement *v1.Placement
		CloudInit *v1.CloudInit
		Port      int32
	}{t.Provider, t.Placement, t.CloudInit, t.Port})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

// observed is a pool's members as the cache holds them.
type observed struct {
	members []*member
	proxies map[string]*v1.Proxy // by name
	// taken holds every Proxy name in the namespace, members or not.
	taken map[string]bool
}

func (r *Reconciler) observe(ctx context.Context, pool *v1.ProxyPool, hash string, snap leaseview.Snapshot) (*observed, error) {
	list := &v1.ProxyList{}
	if err := r.client.List(ctx, list, client.InNamespace(pool.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the Proxies of namespace %s: %w", pool.Namespace, err)
	}
	o := &observed{proxies: map[string]*v1.Proxy{}, taken: make(map[string]bool, len(list.Items))}
	for i := range list.Items {
		px := &list.Items[i]
		o.taken[px.Name] = true
		if !metav1.IsControlledBy(px, pool) {
			continue
		}
		o.proxies[px.Name] = px
		m := &member{
			name: px.Name, created: px.CreationTimestamp.Time,
			updated:      px.Labels[v1.LabelTemplateHash] == hash,
			ready:        meta.IsStatusConditionTrue(px.Status.Conditions, v1.ConditionReady),
			deleting:     !px.DeletionTimestamp.IsZero(),
			leases:       snap.Leases[px.Key()],
			doNotDisrupt: px.Annotations[v1.AnnotationDoNotDisrupt] == "true",
		}
		m.healthy = m.ready && px.Status.Healthy
		m.since = since(px)
		if m.ready {
			m.egressIP = px.Status.EgressIP
		}
		m.replaces = px.Annotations[v1.AnnotationReplaces]
		m.retries, _ = strconv.Atoi(px.Annotations[v1.AnnotationSlotRetries])
		if pool.Spec.MaxAge != nil {
			m.ageLimit = jittered(pool.Spec.MaxAge.Duration, px.UID)
		}
		m.deadline, _ = px.DrainDeadline()
		o.members = append(o.members, m)
	}
	return o, nil
}

// since is when a healthy member became healthy, or when an unhealthy
// Ready one stopped being healthy: the later of its Ready and Healthy
// conditions' transitions.
func since(px *v1.Proxy) time.Time {
	var t time.Time
	for _, c := range []string{v1.ConditionReady, v1.ConditionHealthy} {
		if cond := meta.FindStatusCondition(px.Status.Conditions, c); cond != nil && cond.LastTransitionTime.After(t) {
			t = cond.LastTransitionTime.Time
		}
	}
	if t.IsZero() {
		t = px.CreationTimestamp.Time
	}
	return t
}

// jittered is maxAge less up to a tenth of it, the fraction fixed by the
// member's UID: members made together rotate spread over that tenth,
// and every controller computes the same limit.
func jittered(maxAge time.Duration, uid types.UID) time.Duration {
	sum := sha256.Sum256([]byte(uid))
	frac := float64(binary.BigEndian.Uint64(sum[:8])) / float64(math.MaxUint64)
	return maxAge - time.Duration(frac*float64(maxAge)/10)
}

func (r *Reconciler) reconcileNormal(ctx context.Context, pool *v1.ProxyPool) (ctrl.Result, error) {
	l, err := resolve(pool, r.opts.Settle)
	if err != nil {
		return ctrl.Result{}, err
	}
	hash := templateHash(&pool.Spec.Template.Spec)
	// One snapshot for the whole reconcile: the counts and the time they
	// were read must go together.
	snap := r.leases.Snapshot()
	o, err := r.observe(ctx, pool, hash, snap)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := time.Now()
	scaled, scaleWait, err := r.autoscale(ctx, pool, l, o, snap, now)
	if scaled || err != nil {
		// The new size comes back as an update of the pool.
		return ctrl.Result{}, err
	}
	p := decide(l, o.members, snap.At, now)
	r.setStatus(pool, l, o, p, snap.Known())

	errs := []error{r.syncInPlace(ctx, pool, o)}
	for _, d := range p.delete {
		errs = append(errs, r.deleteMember(ctx, pool, o.proxies[d.m.name], d.why))
	}
	// Rounded up to the annotation's whole seconds, so the start the plan
	// derives from it (deadline − drainTimeout) is never before the real
	// one and the settle time is never cut short.
	deadline := now.Add(l.drainTimeout + time.Second - 1).Truncate(time.Second)
	for _, d := range p.drain {
		errs = append(errs, r.drainMember(ctx, pool, o.proxies[d.m.name], deadline, d.why))
	}
	for _, name := range p.settled {
		errs = append(errs, r.settle(ctx, o.proxies[name]))
	}
	errs = append(errs, r.createMembers(ctx, pool, hash, o.taken, p.creates))
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, err
	}
	draining := len(p.drain) > 0
	for _, m := range o.members {
		draining = draining || m.draining()
	}
	r.polls.follow(types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}, draining || pool.Spec.Autoscaling != nil)
	next := r.nextDrainCheck(l, o, p, now)
	for _, d := range []time.Duration{p.wake, scaleWait} {
		if d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// settle restarts the retry count of a member's slot: it has been
// healthy long enough to show the slot works.
func (r *Reconciler) settle(ctx context.Context, px *v1.Proxy) error {
	next := px.DeepCopy()
	delete(next.Annotations, v1.AnnotationSlotRetries)
	if err := client.IgnoreNotFound(r.client.Patch(ctx, next, client.MergeFrom(px))); err != nil {
		return fmt.Errorf("restarting the retry count of member %s: %w", px.Name, err)
	}
	return nil
}

// maxDrainPoll bounds how long a draining member goes unchecked when no
// poll of the broker wakes its pool (the broker does not answer).
const maxDrainPoll = 10 * time.Second

// nextDrainCheck is when a pool with draining members must look again:
// at the earliest deadline, when a drain's settle time has passed, and
// at least every maxDrainPoll; 0 when nothing drains.
func (r *Reconciler) nextDrainCheck(l limits, o *observed, p plan, now time.Time) time.Duration {
	next := time.Duration(0)
	consider := func(d time.Duration) {
		d = max(d, 100*time.Millisecond)
		if next == 0 || d < next {
			next = d
		}
	}
	if len(p.drain) > 0 {
		consider(r.opts.Settle)
	}
	for _, m := range o.members {
		if !m.draining() {
			continue
		}
		if settled := m.deadline.Add(-l.drainTimeout + l.settle); settled.After(now) {
			consider(settled.Sub(now))
		}
		consider(min(m.deadline.Sub(now), maxDrainPoll))
	}
	return next
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
	next := px.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[v1.AnnotationDrainDeadline] = deadline.UTC().Format(time.RFC3339)
	if err := r.client.Patch(ctx, next, client.MergeFromWithOptions(px, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("draining member %s: %w", px.Name, err)
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
