// Package lifecycle is the Proxy reconciler: it provisions Managed proxies
// through their provider, replaces an instance when an immutable field
// changes, tracks External proxies, and deletes instances behind a
// finalizer. It is crash-safe by construction: every reconcile derives one
// action from (spec, status, provider Get), instance names are
// deterministic per Proxy and generation, and Create is idempotent, so a
// controller killed between any two steps converges on restart without a
// duplicate or a leak (orphan GC is the net for what is left).
package lifecycle

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/statuspatch"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Options tune the reconciler; zero values take the defaults.
type Options struct {
	// PollInterval is how often a Proxy whose instance is booting or being
	// deleted is re-read.
	PollInterval time.Duration
	// ResyncInterval is how often a Ready Managed proxy's instance is
	// re-read to notice it vanished outside the controller.
	ResyncInterval time.Duration
	// ResyncQPS bounds those re-reads per provider entry and second
	// (see resyncs); 0 means DefaultResyncQPS.
	ResyncQPS float64
	// BackoffBase and BackoffMax bound the per-Proxy exponential backoff
	// of quota waits, unavailable providers and failing cleanups.
	BackoffBase, BackoffMax time.Duration
	// MaxConcurrentReconciles is how many Proxies reconcile at once; 0
	// means DefaultMaxConcurrentReconciles.
	MaxConcurrentReconciles int
	// CredentialsKey derives each Managed instance's proxy credentials;
	// empty makes instances that ask for none.
	CredentialsKey proxyauth.Key
	// SecretNamespaces are where cloud-init Secrets are read (all when
	// empty): a Proxy naming one elsewhere is told so.
	SecretNamespaces []string
	// Clock is the reconciler's time; nil is the wall clock. Tests step
	// a fake one.
	Clock clock.PassiveClock
}

// DefaultResyncQPS lets one provider entry re-read 6,000 Ready instances
// in the default 5-minute interval.
const DefaultResyncQPS = 20

// DefaultMaxConcurrentReconciles keeps a fleet's bring-up bound by the API
// server rather than by workers, and leaves workers free while some wait
// on a slow provider call (a KVM create holds its worker until the VM
// starts).
const DefaultMaxConcurrentReconciles = 32

func (o *Options) defaults() {
	if o.PollInterval == 0 {
		o.PollInterval = 2 * time.Second
	}
	if o.ResyncInterval == 0 {
		o.ResyncInterval = 5 * time.Minute
	}
	if o.BackoffBase == 0 {
		o.BackoffBase = 5 * time.Second
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = 5 * time.Minute
	}
	if o.ResyncQPS == 0 {
		o.ResyncQPS = DefaultResyncQPS
	}
	if o.MaxConcurrentReconciles == 0 {
		o.MaxConcurrentReconciles = DefaultMaxConcurrentReconciles
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// Reconciler reconciles Proxy objects.
type Reconciler struct {
	client   client.Client
	registry *providers.Registry
	recorder events.EventRecorder
	log      *slog.Logger
	opts     Options
	backoff  workqueue.TypedRateLimiter[string]
	resync   *resyncs
}

// New returns a Reconciler.
func New(c client.Client, registry *providers.Registry, recorder events.EventRecorder, log *slog.Logger, opts Options) *Reconciler {
	opts.defaults()
	return &Reconciler{
		client: c, registry: registry, recorder: recorder, log: log, opts: opts,
		backoff: workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.BackoffBase, opts.BackoffMax),
		resync:  newResyncs(opts.ResyncInterval, opts.ResyncQPS, opts.Clock),
	}
}

const secretRefIndex = "spec.cloudInit.secretRef.name"

// SetupWithManager registers the reconciler, its Secret watch and index.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1.Proxy{}, secretRefIndex, func(o client.Object) []string {
		px := o.(*v1.Proxy)
		if px.Spec.CloudInit == nil || px.Spec.CloudInit.SecretRef == nil {
			return nil
		}
		return []string{px.Spec.CloudInit.SecretRef.Name}
	}); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxy-lifecycle").
		// Our own status writes change neither generation, annotations
		// nor deletion, so they do not come back as reconciles.
		For(&v1.Proxy{}, builder.WithPredicates(specOrMetaChanged)).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.proxiesForSecret)).
		WithOptions(controller.Options{MaxConcurrentReconciles: r.opts.MaxConcurrentReconciles}).
		Complete(r)
}

var specOrMetaChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		o, n := e.ObjectOld, e.ObjectNew
		return o.GetGeneration() != n.GetGeneration() ||
			!equality.Semantic.DeepEqual(o.GetAnnotations(), n.GetAnnotations()) ||
			!o.GetDeletionTimestamp().Equal(n.GetDeletionTimestamp()) ||
			!equality.Semantic.DeepEqual(o.GetFinalizers(), n.GetFinalizers())
	},
}

func (r *Reconciler) proxiesForSecret(ctx context.Context, o client.Object) []reconcile.Request {
	list := &v1.ProxyList{}
	if err := r.client.List(ctx, list, client.InNamespace(o.GetNamespace()), client.MatchingFields{secretRefIndex: o.GetName()}); err != nil {
		r.log.ErrorContext(ctx, "listing Proxies for Secret", "secret", client.ObjectKeyFromObject(o).String(), "err", err)
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, px := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&px)})
	}
	return reqs
}

var tracer = otel.Tracer("egress-proxies/controller/lifecycle")

// scope is one reconcile's working state.
type scope struct {
	px   *v1.Proxy
	base *v1.Proxy // status patches diff against this
	// released: the finalizer is gone, the object may be too; no status
	// patch follows.
	released bool
}

// Reconcile is the fixed skeleton: fetch, finalizer, deferred status
// patch, then reconcileDelete or reconcileNormal.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	ctx, span := tracer.Start(providers.WithCaller(ctx, providers.CallerLifecycle), "proxy.Reconcile", trace.WithAttributes(
		attribute.String("proxy.namespace", req.Namespace), attribute.String("proxy.name", req.Name)))
	defer func() {
		if retErr != nil {
			span.RecordError(retErr)
			span.SetStatus(codes.Error, retErr.Error())
		}
		span.End()
	}()
	px := &v1.Proxy{}
	if err := r.client.Get(ctx, req.NamespacedName, px); err != nil {
		if apierrors.IsNotFound(err) {
			r.resync.forget(req.String())
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	if px.DeletionTimestamp.IsZero() && px.Spec.Mode == v1.ModeManaged && !controllerutil.ContainsFinalizer(px, v1.Finalizer) {
		base := px.DeepCopy()
		controllerutil.AddFinalizer(px, v1.Finalizer)
		if err := r.client.Patch(ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
	}

	s := &scope{px: px, base: px.DeepCopy()}
	defer func() { statuspatch.FoldInto(r.patchStatus(ctx, s, retErr == nil), &res, &retErr) }()

	if !px.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	return r.reconcileNormal(ctx, s)
}
