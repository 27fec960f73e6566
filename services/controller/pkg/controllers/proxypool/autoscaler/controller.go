// Package autoscaler sets autoscaled ProxyPools' spec.replicas from lease
// demand and writes nothing else: it updates /scale, as a
// HorizontalPodAutoscaler drives a Deployment, and the pool's rollout
// (package proxypool) makes the members. It reads what any client could:
// the pool, the Proxies it controls, and the live leases.
package autoscaler

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
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// maxSnapshotAge is how old a lease snapshot may be to scale on: older,
// the broker has not answered for several polls and demand is unknown.
const maxSnapshotAge = 30 * time.Second

// defaultStabilization is spec.autoscaling.scaleDownStabilization when unset.
const defaultStabilization = 5 * time.Minute

// Autoscaler reconciles a pool when the pool changes and after every
// poll of the broker.
type Autoscaler struct {
	client   client.Client
	leases   leaseview.Source
	wake     *leaseview.Wake
	recorder events.EventRecorder
	clock    clock.PassiveClock

	mu sync.Mutex
	// history keeps each pool's recommendations; a key never reconciles
	// twice at once, so the lock guards the map only.
	history map[types.NamespacedName]*history
}

// New returns an autoscaler that reads demand from leases and is woken
// by wake (whose Polled the lease poller calls); clk nil is the wall
// clock.
func New(c client.Client, leases leaseview.Source, wake *leaseview.Wake, recorder events.EventRecorder, clk clock.PassiveClock) *Autoscaler {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Autoscaler{client: c, leases: leases, wake: wake, recorder: recorder, clock: clk, history: map[types.NamespacedName]*history{}}
}

// SetupWithManager registers the autoscaler.
func (a *Autoscaler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxypool-autoscaler").
		For(&v1.ProxyPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(a.wake.Source()).
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
		a.wake.Follow(req.NamespacedName, false)
		a.mu.Lock()
		delete(a.history, req.NamespacedName)
		a.mu.Unlock()
		return ctrl.Result{}, nil
	}
	a.wake.Follow(req.NamespacedName, true)
	now := a.clock.Now()
	snap := a.leases.Snapshot()
	if !snap.Known() || now.Sub(snap.At) > maxSnapshotAge {
		return ctrl.Result{}, nil // the next poll wakes it
	}
	list := &v1.ProxyList{}
	if err := a.client.List(ctx, list, client.InNamespace(pool.Namespace), client.UnsafeDisableDeepCopy); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the Proxies of namespace %s: %w", pool.Namespace, err)
	}
	wait, err := a.scale(ctx, pool, demandOf(pool, list.Items, snap, now), now)
	return ctrl.Result{RequeueAfter: wait}, err
}

// demandOf is what the pool's members and the leases say of demand.
// Members on their way out (draining or deleted) count for nothing; one
// not yet Healthy within its startup timeout may still come up, and
// holds a scale-up back until it has.
func demandOf(pool *v1.ProxyPool, proxies []v1.Proxy, snap leaseview.Snapshot, now time.Time) demand {
	d := demand{current: pool.DesiredReplicas(), refused: snap.Refused(pool.Namespace, pool.Spec.Template.Spec.Attributes)}
	startup := pool.StartupTimeout()
	active := 0
	for i := range proxies {
		px := &proxies[i]
		if !metav1.IsControlledBy(px, pool) || !px.DeletionTimestamp.IsZero() {
			continue
		}
		if _, draining := px.DrainDeadline(); draining {
			continue
		}
		active++
		d.leases += int64(snap.Leases[px.Key()])
		if px.IsReady() && px.Status.IsHealthy() {
			d.leasable++
		} else if now.Sub(px.CreationTimestamp.Time) < startup {
			d.settling = true
		}
	}
	d.settling = d.settling || active < d.current
	return d
}

// scale sets spec.replicas (through /scale) from demand; when a
// scale-down waits for its window, wait says how long.
func (a *Autoscaler) scale(ctx context.Context, pool *v1.ProxyPool, d demand, now time.Time) (wait time.Duration, err error) {
	as := pool.Spec.Autoscaling
	b := bounds{min: int(as.MinReplicas), max: int(as.MaxReplicas), target: int(as.TargetLeasesPerProxy)}
	if b.target == 0 {
		b.target = defaultTargetLeases
	}
	rec, why := recommend(b, d)
	h := a.historyOf(client.ObjectKeyFromObject(pool), pool.UID)
	window := defaultStabilization
	if as.ScaleDownStabilization != nil {
		window = as.ScaleDownStabilization.Duration
	}
	next, why, wait := h.decide(b, d, rec, why, now, window)
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
	h.restart(now)
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
