// Package proxypool is the ProxyPool's rollout. It keeps spec.replicas
// Managed Proxies made from the pool's template, and takes members out
// one way only, whatever the cause (scale-down, a template rollout,
// remediation, maxAge): a replacement first, where there is one, then a
// drain that lets the member's live leases end, then deletion. Package
// autoscaler, beside it, only writes the pool's /scale, from lease
// demand, as a HorizontalPodAutoscaler drives a Deployment.
//
// A rollout reconcile has three steps, each in a file of its own:
// observe (observe.go) reads the members and their lease counts; decide
// (plan.go), a pure function, turns them into a plan of per-member
// verdicts and creations, from which status is derived (status.go);
// execute (execute.go) hands the plan's changes to the pool's member set
// (package memberset, which a ProxySource's members share), which makes
// the writes and waits for the cache to hold them. Crash safety comes from the planner's purity and from
// deterministic member names: a restarted controller, or one whose cache
// lags its own writes, tries to create the same names again and gets
// AlreadyExists, never a second member.
package proxypool

import (
	"context"
	"log/slog"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/statuspatch"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// Options tune the reconciler; zero values take the defaults.
type Options struct {
	// MarkLag is how long after a drain begins a lease count must have
	// been read to end the drain: brokers stop leasing the member only
	// once their informers have seen its drain annotation.
	MarkLag time.Duration
	// CreateWorkers bounds the member creations one reconcile makes at
	// once, so a pool of 1,000 comes up at the API server's pace.
	CreateWorkers int
	// MaxConcurrentReconciles is how many pools reconcile at once.
	MaxConcurrentReconciles int
	// MemberBatch is how long a member's change waits before its pool
	// reconciles, so the changes of many members (a thousand coming up at
	// once) make one reconcile and one status write, not one each.
	MemberBatch time.Duration
	// Clock is the reconciler's time; nil is the wall clock. Tests step
	// a fake one.
	Clock clock.PassiveClock
}

func (o *Options) defaults() {
	if o.MarkLag == 0 {
		o.MarkLag = memberset.DefaultMarkLag
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
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// Reconciler is the rollout: it reconciles ProxyPools' members.
type Reconciler struct {
	client   client.Client
	leases   leaseview.Source
	wakeups  *Wakeups
	recorder events.EventRecorder
	log      *slog.Logger
	opts     Options
}

// New returns a rollout that learns live leases from leases and is woken
// by wakeups.
func New(c client.Client, leases leaseview.Source, wakeups *Wakeups, recorder events.EventRecorder, log *slog.Logger, opts Options) *Reconciler {
	opts.defaults()
	return &Reconciler{client: c, leases: leases, wakeups: wakeups, recorder: recorder, log: log, opts: opts}
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxypool").
		// Our own status writes do not come back as reconciles: each
		// member's change would otherwise cost the pool two.
		For(&v1.ProxyPool{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1.Proxy{}, r.memberEvents()).
		WatchesRawSource(r.wakeups.Source()).
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

// Reconcile is the fixed skeleton: fetch, deferred status patch, then
// reconcileNormal. A pool has no finalizer: its members carry controller
// ownerReferences, so deleting the pool has the garbage collector delete
// them, each through its own instance-cleanup finalizer.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	pool := &v1.ProxyPool{}
	if err := r.client.Get(ctx, req.NamespacedName, pool); err != nil {
		if apierrors.IsNotFound(err) {
			r.wakeups.Follow(req.NamespacedName, false)
			forgetGauges(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	base := pool.DeepCopy()
	defer func() {
		statuspatch.New(v1.WriterPool, r.client).Deferred(ctx, base, pool, &res, &retErr)
	}()
	return r.reconcileNormal(ctx, pool)
}

// reconcileNormal observes, decides, derives status, and executes.
func (r *Reconciler) reconcileNormal(ctx context.Context, pool *v1.ProxyPool) (ctrl.Result, error) {
	l, err := resolve(pool, r.opts.MarkLag)
	if err != nil {
		return ctrl.Result{}, err
	}
	hash := templateHash(&pool.Spec.Template.Spec)
	// One snapshot for the whole reconcile: the counts and the time they
	// were read must go together.
	snap := r.leases.Snapshot()
	o, err := observe(ctx, r.client, pool, hash, snap)
	if err != nil {
		return ctrl.Result{}, err
	}
	now := r.opts.Clock.Now()
	cmd := decide(l, o.members, snap.At, now)
	r.setStatus(pool, l, o, cmd, snap.Known())
	draining := len(cmd.drain)
	for _, m := range o.members {
		if m.draining() {
			draining++
		}
	}
	gauge(pool, draining, cmd.paused != "")
	if len(cmd.drain)+len(cmd.delete)+len(cmd.creates) > 0 {
		r.log.DebugContext(ctx, "executing", "pool", client.ObjectKeyFromObject(pool), "drain", cmd.drain, "delete", cmd.delete, "create", len(cmd.creates))
	}
	if err := r.execute(ctx, pool, hash, l, o, cmd, now); err != nil {
		return ctrl.Result{}, err
	}
	r.wakeups.Follow(client.ObjectKeyFromObject(pool), draining > 0)
	next := r.nextDrainCheck(l, o, cmd, now)
	if cmd.wake > 0 && (next == 0 || cmd.wake < next) {
		next = cmd.wake
	}
	return ctrl.Result{RequeueAfter: next}, nil
}

// nextDrainCheck is when a pool with draining members must look again:
// at the earliest deadline, when a drain's mark lag has passed, and
// at least every memberset.MaxPoll; 0 when nothing drains.
func (r *Reconciler) nextDrainCheck(l limits, o *observed, cmd plan, now time.Time) time.Duration {
	next := time.Duration(0)
	consider := func(d time.Duration) {
		d = max(d, 100*time.Millisecond)
		if next == 0 || d < next {
			next = d
		}
	}
	if len(cmd.drain) > 0 {
		consider(r.opts.MarkLag)
	}
	for _, m := range o.members {
		if m.draining() {
			consider(memberset.NextDrainCheck(m.deadline, l.drainTimeout, l.markLag, now))
		}
	}
	return next
}
