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
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/telemetry"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
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
}

// Reconciler reconciles Proxy objects.
type Reconciler struct {
	client   client.Client
	registry *providers.Registry
	recorder events.EventRecorder
	opts     Options
	backoff  workqueue.TypedRateLimiter[string]
	resync   *resyncs
}

// New returns a Reconciler.
func New(c client.Client, registry *providers.Registry, recorder events.EventRecorder, opts Options) *Reconciler {
	opts.defaults()
	return &Reconciler{
		client: c, registry: registry, recorder: recorder, opts: opts,
		backoff: workqueue.NewTypedItemExponentialFailureRateLimiter[string](opts.BackoffBase, opts.BackoffMax),
		resync:  newResyncs(opts.ResyncInterval, opts.ResyncQPS),
	}
}

const secretRefIndex = "spec.cloudInit.secretRef.name"

// conflictRetry is how soon a reconcile whose status write lost an
// optimistic-lock race runs again.
const conflictRetry = 100 * time.Millisecond

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
		logf.FromContext(ctx).Error(err, "listing Proxies for Secret", "secret", client.ObjectKeyFromObject(o))
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
	ctx, span := tracer.Start(ctx, "proxy.Reconcile", trace.WithAttributes(
		attribute.String("proxy.namespace", req.Namespace), attribute.String("proxy.name", req.Name)))
	defer func() {
		if retErr != nil {
			span.RecordError(retErr)
			span.SetStatus(codes.Error, retErr.Error())
		}
		span.End()
	}()
	log := telemetry.LogrWithSpan(ctx, logf.FromContext(ctx))
	ctx = logf.IntoContext(ctx, log)

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
	defer func() {
		err := r.patchStatus(ctx, s)
		switch {
		case apierrors.IsConflict(err):
			// Someone (often our own previous reconcile, through a cache
			// that has not caught up) wrote first: decide again on a fresh
			// read. Expected churn, not an error.
			if retErr == nil {
				res = ctrl.Result{RequeueAfter: conflictRetry}
			}
		case err != nil:
			retErr = errors.Join(retErr, err)
		}
	}()

	if !px.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, s)
	}
	return r.reconcileNormal(ctx, s)
}

// patchStatus writes the status only when it changed, with an optimistic
// lock so a decision taken on a stale read never lands, and emits an Event
// for every change of the Ready condition.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope) error {
	if s.released || equality.Semantic.DeepEqual(s.base.Status, s.px.Status) {
		return nil
	}
	if err := r.client.Status().Patch(ctx, s.px, client.MergeFromWithOptions(s.base, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("patching status: %w", err)
	}
	metrics.StatusWrites.WithLabelValues("lifecycle").Inc()
	r.emitTransition(s.base, s.px)
	return nil
}

func (r *Reconciler) emitTransition(before, after *v1.Proxy) {
	old := meta.FindStatusCondition(before.Status.Conditions, v1.ConditionReady)
	cur := meta.FindStatusCondition(after.Status.Conditions, v1.ConditionReady)
	if cur == nil || (old != nil && old.Reason == cur.Reason && old.Message == cur.Message) || cur.Reason == v1.ReasonTracking {
		// An External proxy is tracked the moment it exists: an Event per
		// proxy would add a third to the API writes of a bulk import and
		// say nothing its status does not.
		return
	}
	typ := corev1.EventTypeNormal
	if warningReasons[cur.Reason] {
		typ = corev1.EventTypeWarning
	}
	r.recorder.Eventf(after, nil, typ, cur.Reason, string(after.Status.Phase), "%s", cur.Message)
}

var warningReasons = map[string]bool{
	v1.ReasonUnknownProvider: true, v1.ReasonProviderUnavailable: true, v1.ReasonInvalidPlacement: true,
	v1.ReasonCloudInitError: true, v1.ReasonQuotaExceeded: true, v1.ReasonProviderError: true,
	v1.ReasonCleanupFailed: true, v1.ReasonInstanceLost: true,
}

func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	px.Status.ObservedGeneration = px.Generation
	if px.Status.Phase == "" {
		px.Status.Phase = v1.PhasePending
	}
	if meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy) == nil {
		resetHealth(px, "not probed yet")
	}
	if px.Spec.Mode == v1.ModeExternal {
		return r.reconcileExternal(px)
	}
	return r.reconcileManaged(ctx, px)
}

func (r *Reconciler) reconcileExternal(px *v1.Proxy) (ctrl.Result, error) {
	// A new address is a new proxy as far as health goes, as a Managed
	// replacement is: what was proven of the old address must not keep the
	// new one leasable while the failure threshold catches up.
	if px.Status.IP != "" && (px.Status.IP != px.Spec.Address || px.Status.Port != px.Spec.Port) {
		resetHealth(px, fmt.Sprintf("address changed from %s:%d to %s:%d; not probed yet", px.Status.IP, px.Status.Port, px.Spec.Address, px.Spec.Port))
	}
	px.Status.IP = px.Spec.Address
	px.Status.Port = px.Spec.Port
	px.Status.Phase = v1.PhaseReady
	setReady(px, metav1.ConditionTrue, v1.ReasonTracking, fmt.Sprintf("tracking external proxy at %s:%d", px.Spec.Address, px.Spec.Port))
	return ctrl.Result{}, nil
}

func (r *Reconciler) reconcileManaged(ctx context.Context, px *v1.Proxy) (ctrl.Result, error) {
	key := px.Namespace + "/" + px.Name
	prov, err := r.registry.Get(px.Spec.Provider)
	if err != nil {
		if providers.IsUnknownProvider(err) {
			return r.fail(px, v1.ReasonUnknownProvider, err.Error())
		}
		r.fail(px, v1.ReasonProviderUnavailable, err.Error())
		return ctrl.Result{RequeueAfter: r.backoff.When(key)}, nil
	}
	cloudInit, err := r.resolveCloudInit(ctx, px)
	if err != nil {
		var cie *cloudInitError
		if errors.As(err, &cie) {
			return r.fail(px, v1.ReasonCloudInitError, err.Error())
		}
		return ctrl.Result{}, err
	}
	hash := SpecHash(px.Spec, cloudInit)
	st := &px.Status

	if st.ProviderID != "" && st.SpecHash != hash {
		return r.replace(ctx, px, prov, cloudInit, hash)
	}
	if st.ProviderID == "" {
		return r.create(ctx, px, prov, cloudInit, hash)
	}
	if st.Phase == v1.PhaseReady && meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReady) {
		if wait := r.resync.wait(key, px.Spec.Provider); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	inst, err := prov.Get(ctx, st.ProviderID)
	switch {
	case providers.IsNotFound(err):
		setReady(px, metav1.ConditionFalse, v1.ReasonInstanceLost, fmt.Sprintf("instance %s disappeared outside the controller; creating it again", st.ProviderID))
		st.ProviderID, st.IP = "", ""
		resetHealth(px, "instance recreated; not probed yet")
		return r.create(ctx, px, prov, cloudInit, hash)
	case err != nil:
		return r.providerError(px, err)
	}
	return r.observe(ctx, px, prov, inst)
}

// replace deletes the current instance and, once it is gone, creates the
// next generation. Delete-then-create: a proxy is cattle, and two
// instances of one Proxy would both be leasable.
func (r *Reconciler) replace(ctx context.Context, px *v1.Proxy, prov providers.Provider, cloudInit []byte, hash string) (ctrl.Result, error) {
	st := &px.Status
	px.Status.Phase = v1.PhaseReplacing
	// Clients must stop seeing the old address as soon as it is on its way out.
	st.IP = ""
	setReady(px, metav1.ConditionFalse, v1.ReasonReplacing, fmt.Sprintf("placement, cloudInit or port changed: deleting %s before creating its replacement", st.ProviderID))
	inst, err := prov.Get(ctx, st.ProviderID)
	switch {
	case providers.IsNotFound(err):
		st.InstanceGeneration = max(st.InstanceGeneration, 1) + 1
		st.ProviderID, st.SpecHash = "", ""
		resetHealth(px, "replacement not probed yet")
		return r.create(ctx, px, prov, cloudInit, hash)
	case err != nil:
		return r.providerError(px, err)
	}
	if inst.State != providers.StateTerminating {
		if err := prov.Delete(ctx, st.ProviderID); err != nil {
			return r.providerError(px, err)
		}
	}
	return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
}

func (r *Reconciler) create(ctx context.Context, px *v1.Proxy, prov providers.Provider, cloudInit []byte, hash string) (ctrl.Result, error) {
	st := &px.Status
	gen := max(st.InstanceGeneration, 1)
	var placement v1.Placement
	if px.Spec.Placement != nil {
		placement = *px.Spec.Placement
	}
	inst, err := prov.Create(ctx, &providers.CreateRequest{
		Name:      providers.InstanceName(px.Name, px.UID, gen),
		Owner:     providers.Owner{UID: px.UID, Namespace: px.Namespace, Name: px.Name, Generation: gen},
		Placement: placement,
		CloudInit: cloudInit,
		Port:      px.Spec.Port,
	})
	if err != nil {
		return r.providerError(px, err)
	}
	st.ProviderID, st.InstanceGeneration, st.SpecHash = inst.ProviderID, gen, hash
	return r.observe(ctx, px, prov, inst)
}

func (r *Reconciler) observe(ctx context.Context, px *v1.Proxy, prov providers.Provider, inst *providers.Instance) (ctrl.Result, error) {
	r.backoff.Forget(px.Namespace + "/" + px.Name)
	switch {
	case inst.Ready():
		px.Status.Phase = v1.PhaseReady
		px.Status.IP = inst.IP
		px.Status.Port = px.Spec.Port
		setReady(px, metav1.ConditionTrue, v1.ReasonRunning, fmt.Sprintf("instance %s running at %s:%d", inst.ProviderID, inst.IP, px.Spec.Port))
		return ctrl.Result{RequeueAfter: r.resync.next()}, nil
	case inst.State == providers.StateFailed:
		if err := prov.Delete(ctx, inst.ProviderID); err != nil {
			return r.providerError(px, err)
		}
		px.Status.Phase = v1.PhaseProvisioning
		px.Status.IP = ""
		setReady(px, metav1.ConditionFalse, v1.ReasonInstanceLost, fmt.Sprintf("instance %s failed; deleting it to create it again", inst.ProviderID))
	default:
		px.Status.Phase = v1.PhaseProvisioning
		px.Status.IP = ""
		setReady(px, metav1.ConditionFalse, v1.ReasonProvisioning, fmt.Sprintf("waiting for instance %s to run", inst.ProviderID))
	}
	return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
}

// providerError turns a provider error into status and a retry policy.
func (r *Reconciler) providerError(px *v1.Proxy, err error) (ctrl.Result, error) {
	switch {
	case providers.IsInvalidConfig(err):
		return r.fail(px, v1.ReasonInvalidPlacement, err.Error())
	case providers.IsQuota(err):
		if px.Status.Phase == v1.PhasePending || px.Status.Phase == v1.PhaseFailed {
			px.Status.Phase = v1.PhaseProvisioning
		}
		setReady(px, metav1.ConditionFalse, v1.ReasonQuotaExceeded, "waiting for quota or capacity: "+err.Error())
		return ctrl.Result{RequeueAfter: r.backoff.When(px.Namespace + "/" + px.Name)}, nil
	default:
		setReady(px, metav1.ConditionFalse, v1.ReasonProviderError, err.Error())
		return ctrl.Result{}, err
	}
}

// fail records a condition no retry can fix until something changes (the
// spec, the Secret, the config); nothing is requeued.
func (r *Reconciler) fail(px *v1.Proxy, reason, msg string) (ctrl.Result, error) {
	px.Status.Phase = v1.PhaseFailed
	setReady(px, metav1.ConditionFalse, reason, msg)
	return ctrl.Result{}, nil
}

func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	if !controllerutil.ContainsFinalizer(px, v1.Finalizer) {
		return ctrl.Result{}, nil
	}
	key := px.Namespace + "/" + px.Name
	r.resync.forget(key)
	px.Status.Phase = v1.PhaseDeleting
	id := px.Status.ProviderID

	if px.Annotations[v1.AnnotationSkipCleanup] == "true" {
		left := "no recorded instance"
		if id != "" {
			left = "instance " + id
		}
		r.recorder.Eventf(px, nil, corev1.EventTypeWarning, "CleanupSkipped", "Delete",
			"%s set: abandoned %s of provider %q, which is left running; remove it by hand (orphan GC collects it if that provider becomes usable again)",
			v1.AnnotationSkipCleanup, left, px.Spec.Provider)
		return ctrl.Result{}, r.release(ctx, s)
	}
	// Nothing recorded means nothing created, or a create whose status
	// write was lost: orphan GC owns that case (the owner UID is gone).
	if px.Spec.Mode == v1.ModeExternal || id == "" {
		return ctrl.Result{}, r.release(ctx, s)
	}

	cleanupFailed := func(err error) (ctrl.Result, error) {
		setReady(px, metav1.ConditionFalse, v1.ReasonCleanupFailed, fmt.Sprintf(
			"cannot delete instance %s: %v; the Proxy stays until cleanup succeeds, or annotate it %s=true to abandon the instance",
			id, err, v1.AnnotationSkipCleanup))
		return ctrl.Result{RequeueAfter: r.backoff.When(key)}, nil
	}
	prov, err := r.registry.Get(px.Spec.Provider)
	if err != nil {
		return cleanupFailed(err)
	}
	inst, err := prov.Get(ctx, id)
	switch {
	case providers.IsNotFound(err):
		r.backoff.Forget(key)
		return ctrl.Result{}, r.release(ctx, s)
	case err != nil:
		return cleanupFailed(err)
	}
	if inst.State != providers.StateTerminating {
		if err := prov.Delete(ctx, id); err != nil {
			return cleanupFailed(err)
		}
	}
	px.Status.IP = ""
	setReady(px, metav1.ConditionFalse, v1.ReasonDeleting, fmt.Sprintf("deleting instance %s", id))
	return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
}

// release removes the finalizer; the API server may delete the object at
// once, so no status patch follows.
func (r *Reconciler) release(ctx context.Context, s *scope) error {
	base := s.px.DeepCopy()
	controllerutil.RemoveFinalizer(s.px, v1.Finalizer)
	s.released = true
	if err := r.client.Patch(ctx, s.px, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}

func setReady(px *v1.Proxy, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: px.Generation,
	})
}

// resetHealth: a new instance has not been probed; whatever was known of
// the old one does not carry over.
func resetHealth(px *v1.Proxy, msg string) {
	px.Status.Healthy = false
	px.Status.EgressIP = ""
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
		Type: v1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: v1.ReasonNotProbed, Message: msg, ObservedGeneration: px.Generation,
	})
}
