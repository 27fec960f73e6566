// Package proxypool is the ProxyPool reconciler: it keeps spec.replicas
// Managed Proxies made from the pool's template, and takes members out
// one way only, whatever the cause (scale-down, a template rollout):
// a replacement first, where there is one, then a drain that lets the
// member's live leases end, then deletion.
//
// Crash safety comes from the planner being a pure function of the
// observed members (plan.go) and from deterministic member names: a
// restarted controller, or one whose cache lags its own writes, tries to
// create the same names again and gets AlreadyExists, never a second
// member. Every write is waited for in the cache before the reconcile
// ends, so the next one decides on a view that holds it.
package proxypool

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// Options tune the reconciler; zero values take the defaults.
type Options struct {
	// Settle is how long after a drain begins a lease count must have
	// been read to end the drain: brokers stop leasing the member only
	// once their informers have seen its drain annotation.
	Settle time.Duration
	// CreateWorkers bounds the member creations one reconcile makes at
	// once, so a pool of 1,000 comes up at the API server's pace.
	CreateWorkers int
	// MaxConcurrentReconciles is how many pools reconcile at once.
	MaxConcurrentReconciles int
	// MemberBatch is how long a member's change waits before its pool
	// reconciles, so the changes of many members (a thousand coming up at
	// once) make one reconcile and one status write, not one each.
	MemberBatch time.Duration
}

func (o *Options) defaults() {
	if o.Settle == 0 {
		o.Settle = 2 * time.Second
	}
	if o.CreateWorkers == 0 {
		o.CreateWorkers = 32
	}
	if o.MemberBatch == 0 {
		o.MemberBatch = 500 * time.Millisecond
	}
	if o.MaxConcurrentReconciles == 0 {
		o.MaxConcurrentReconciles = 4
	}
}

// Reconciler reconciles ProxyPools.
type Reconciler struct {
	client   client.Client
	leases   leaseview.Source
	recorder events.EventRecorder
	log      *slog.Logger
	opts     Options
	// wake carries pools to reconcile now: those whose members' lease
	// counts changed, and those following every poll of the broker.
	wake  chan event.GenericEvent
	polls followers
}

// New returns a Reconciler that learns live leases from leases.
func New(c client.Client, leases leaseview.Source, recorder events.EventRecorder, log *slog.Logger, opts Options) *Reconciler {
	opts.defaults()
	return &Reconciler{
		client: c, leases: leases, recorder: recorder, log: log, opts: opts,
		wake:  make(chan event.GenericEvent, 1024),
		polls: followers{history: map[types.NamespacedName]*history{}, pools: map[types.NamespacedName]bool{}},
	}
}

// LeasesChanged wakes the pools of the proxies (ids "namespace/name")
// whose live-lease count changed; it is leaseview.Poller's Changed hook.
func (r *Reconciler) LeasesChanged(ids []string) {
	for _, id := range ids {
		ns, name, _ := strings.Cut(id, "/")
		px := &v1.Proxy{}
		if err := r.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, px); err != nil {
			continue
		}
		if pool, ok := poolOf(px); ok {
			r.wakePool(pool)
		}
	}
}

// wakePool enqueues a pool. It never blocks: when the channel is full the
// pool's own requeue (it drains, or it autoscales) is the fallback.
func (r *Reconciler) wakePool(key types.NamespacedName) {
	select {
	case r.wake <- event.GenericEvent{Object: &v1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	default:
	}
}

// poolOf names the pool that controls o, if one does.
func poolOf(o client.Object) (types.NamespacedName, bool) {
	owner := metav1.GetControllerOf(o)
	if owner == nil || owner.Kind != "ProxyPool" || owner.APIVersion != v1.GroupVersion.String() {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: owner.Name}, true
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxypool").
		// Our own status writes do not come back as reconciles: each
		// member's change would otherwise cost the pool two.
		For(&v1.ProxyPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1.Proxy{}, r.memberEvents()).
		WatchesRawSource(source.Channel(r.wake, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles}).
		Complete(r)
}

// memberEvents enqueues a member's pool MemberBatch after the member
// changes: the queue holds a key once, so every change in the batch is
// one reconcile.
func (r *Reconciler) memberEvents() handler.EventHandler {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if pool, ok := poolOf(o); ok {
			q.AddAfter(reconcile.Request{NamespacedName: pool}, r.opts.MemberBatch)
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.ObjectNew, q)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
	}
}

// conflictRetry is how soon a reconcile whose status write lost an
// optimistic-lock race runs again.
const conflictRetry = 100 * time.Millisecond

// Reconcile is the fixed skeleton: fetch, deferred status patch, then
// reconcileNormal. A pool has no finalizer: its members carry controller
// ownerReferences, so deleting the pool has the garbage collector delete
// them, each through its own instance-cleanup finalizer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	pool := &v1.ProxyPool{}
	if err := r.client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.polls.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	base := pool.DeepCopy()
	defer func() {
		if equality.Semantic.DeepEqual(base.Status, pool.Status) {
			return
		}
		err := r.client.Status().Patch(ctx, pool, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		switch {
		case apierrors.IsConflict(err):
			if retErr == nil {
				res = ctrl.Result{RequeueAfter: conflictRetry}
			}
		case apierrors.IsNotFound(err):
		case err != nil:
			retErr = errors.Join(retErr, err)
		}
	}()
	return r.reconcileNormal(ctx, pool)
}
