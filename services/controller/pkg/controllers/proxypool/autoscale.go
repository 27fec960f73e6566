package proxypool

import (
	"context"
	"fmt"
	"sync"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// demand is what the autoscaler sees of a pool.
type demand struct {
	current int // spec.replicas
	// leasable members (active, Ready and Healthy) and the live leases
	// on active members.
	leasable int
	leases   int64
	// refused counts leases refused in the last window (every match at
	// its cap or cooling down) that a member would have matched.
	refused int64
	// settling: members of an earlier scale-up are still coming up.
	settling bool
}

type bounds struct{ min, max, target int }

const defaultTargetLeases = 5

// recommend is the size demand asks for, within the bounds, and the
// figures that say why. Live leases ask for leases/target members;
// refusals, which mean the members there are all taken, ask for half as
// many again as there are.
func recommend(b bounds, d demand) (int, string) {
	need := int((d.leases + int64(b.target) - 1) / int64(b.target))
	why := fmt.Sprintf("%d live leases on %d leasable members, target %d per member", d.leases, d.leasable, b.target)
	if d.refused > 0 {
		need = max(need, d.current+max(1, d.current/2))
		why += fmt.Sprintf("; %d leases refused in the last %s, every matching member at its cap or cooling down", d.refused, leaseview.RefusalWindow)
	}
	return min(max(need, b.min), b.max), why
}

// history keeps one pool's recommendations over its stabilization window,
// in memory: after a restart the window starts again, which only delays
// a scale-down.
type history struct {
	uid   types.UID // a pool re-created under the name starts afresh
	since time.Time
	recs  []recommendation
}

type recommendation struct {
	at time.Time
	n  int
}

// stabilized records rec at now and returns the largest recommendation
// of the window, and whether the history spans the whole window.
func (h *history) stabilized(rec int, now time.Time, window time.Duration) (int, bool) {
	if h.since.IsZero() {
		h.since = now
	}
	h.recs = append(h.recs, recommendation{now, rec})
	keep := h.recs[:0]
	top := 0
	for _, r := range h.recs {
		if now.Sub(r.at) <= window {
			keep = append(keep, r)
			top = max(top, r.n)
		}
	}
	h.recs = keep
	return top, now.Sub(h.since) >= window
}

// lowerAt is when the window will have asked for no more than rec, if
// demand stays as it is: once it spans the whole window, and the last
// larger recommendation has left it.
func (h *history) lowerAt(rec int, window time.Duration) time.Time {
	at := h.since.Add(window)
	for _, r := range h.recs {
		if r.n > rec && r.at.Add(window).After(at) {
			at = r.at.Add(window)
		}
	}
	return at
}

// maxSnapshotAge is how old a lease snapshot may be to scale on: older,
// the broker has not answered for several polls and demand is unknown.
const maxSnapshotAge = 30 * time.Second

// Autoscaler sets each autoscaled pool's spec.replicas from lease demand
// and writes nothing else: it updates /scale, as a HorizontalPodAutoscaler
// does, and the rollout makes the members. It reconciles a pool when the
// pool changes and after every poll of the broker.
type Autoscaler struct {
	client   client.Client
	leases   leaseview.Source
	wakeups  *Wakeups
	recorder events.EventRecorder

	mu sync.Mutex
	// history keeps each pool's recommendations; a key never reconciles
	// twice at once, so the lock guards the map only.
	history map[types.NamespacedName]*history
}

// NewAutoscaler returns an autoscaler that reads demand from leases and
// is woken by wakeups.
func NewAutoscaler(c client.Client, leases leaseview.Source, wakeups *Wakeups, recorder events.EventRecorder) *Autoscaler {
	return &Autoscaler{client: c, leases: leases, wakeups: wakeups, recorder: recorder, history: map[types.NamespacedName]*history{}}
}

// SetupWithManager registers the autoscaler.
func (a *Autoscaler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxypool-autoscaler").
		For(&v1.ProxyPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(a.wakeups.autoscale, &handler.EnqueueRequestForObject{})).
		Complete(a)
}

// Reconcile scales one pool, or forgets it when it has no autoscaling.
func (a *Autoscaler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &v1.ProxyPool{}
	err := a.client.Get(ctx, req.NamespacedName, pool)
	if client.IgnoreNotFound(err) != nil {
		return ctrl.Result{}, err
	}
	if err != nil || pool.Spec.Autoscaling == nil || !pool.DeletionTimestamp.IsZero() {
		a.wakeups.follow(a.wakeups.autoscaled, req.NamespacedName, false)
		a.mu.Lock()
		delete(a.history, req.NamespacedName)
		a.mu.Unlock()
		return ctrl.Result{}, nil
	}
	a.wakeups.follow(a.wakeups.autoscaled, req.NamespacedName, true)
	l, err := resolve(pool, 0)
	if err != nil {
		return ctrl.Result{}, err
	}
	snap := a.leases.Snapshot()
	if !snap.Known() || time.Since(snap.At) > maxSnapshotAge {
		return ctrl.Result{}, nil // the next poll wakes it
	}
	o, err := observe(ctx, a.client, pool, templateHash(&pool.Spec.Template.Spec), snap)
	if err != nil {
		return ctrl.Result{}, err
	}
	wait, err := a.scale(ctx, pool, l, o, snap, time.Now())
	return ctrl.Result{RequeueAfter: wait}, err
}

// scale sets spec.replicas (through /scale) from demand; when a
// scale-down waits for its window, wait says how long.
func (a *Autoscaler) scale(ctx context.Context, pool *v1.ProxyPool, l limits, o *observed, snap leaseview.Snapshot, now time.Time) (wait time.Duration, err error) {
	key := client.ObjectKeyFromObject(pool)
	as := pool.Spec.Autoscaling
	b := bounds{min: int(as.MinReplicas), max: int(as.MaxReplicas), target: int(as.TargetLeasesPerProxy)}
	if b.target == 0 {
		b.target = defaultTargetLeases
	}
	d := demand{current: l.replicas, refused: snap.Refused(pool.Namespace, pool.Spec.Template.Spec.Attributes)}
	active := 0
	for _, m := range o.members {
		if !m.active() {
			continue
		}
		active++
		d.leases += int64(m.leases)
		if m.healthy {
			d.leasable++
		} else if m.updated && now.Sub(m.created) < l.startupTimeout {
			d.settling = true
		}
	}
	d.settling = d.settling || active < d.current

	rec, why := recommend(b, d)
	h := a.historyOf(key, pool.UID)
	window := durationOr(as.ScaleDownStabilization, 5*time.Minute)
	top, full := h.stabilized(rec, now, window)
	next := d.current
	switch {
	case d.current < b.min || d.current > b.max:
		next = min(max(d.current, b.min), b.max)
		why = fmt.Sprintf("spec.replicas %d is outside minReplicas %d and maxReplicas %d", d.current, b.min, b.max)
	case rec > d.current && !d.settling:
		next = rec
	case top < d.current && full:
		next = top
		why += fmt.Sprintf("; the most asked for in the last %s", window)
	case rec < d.current:
		wait = h.lowerAt(rec, window).Sub(now) + 10*time.Millisecond
	}
	if next == d.current {
		return wait, nil
	}
	scale := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: pool.Name, Namespace: pool.Namespace, ResourceVersion: pool.ResourceVersion},
		Spec:       autoscalingv1.ScaleSpec{Replicas: int32(next)},
	}
	if err := a.client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
		return 0, fmt.Errorf("scaling pool %s to %d: %w", pool.Name, next, err)
	}
	// A new size starts a new window: a scale-down waits a whole window
	// after any change.
	h.since, h.recs = now, nil
	a.recorder.Eventf(pool, nil, corev1.EventTypeNormal, v1.EventScaled, "Scale", "scaled from %d to %d members: %s", d.current, next, why)
	return 0, nil
}

// historyOf returns the pool's history, a new one for a pool new under
// its name.
func (a *Autoscaler) historyOf(key types.NamespacedName, uid types.UID) *history {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.history[key]
	if h == nil || h.uid != uid {
		h = &history{uid: uid}
		a.history[key] = h
	}
	return h
}
