package lifecycle

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// reconcileDelete deletes a Terminating Proxy's instance, then releases
// the finalizer once the provider says the instance is gone.
func (r *Reconciler) reconcileDelete(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	if !controllerutil.ContainsFinalizer(px, v1.Finalizer) {
		return ctrl.Result{}, nil
	}
	key := px.Key()
	r.resync.forget(key)
	id := px.Status.ProviderID

	if px.Annotations[v1.AnnotationSkipCleanup] == "true" {
		left := "no recorded instance"
		if id != "" {
			left = "instance " + id
		}
		r.recorder.Eventf(px, nil, v1.EventType(v1.EventCleanupSkipped), v1.EventCleanupSkipped, "Delete",
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
		markNotReady(px, v1.PhaseDeleting, v1.ReasonCleanupFailed, fmt.Sprintf(
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
	markNotReady(px, v1.PhaseDeleting, v1.ReasonDeleting, fmt.Sprintf("deleting instance %s", id))
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
