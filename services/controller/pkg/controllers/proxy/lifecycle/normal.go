package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	ctrl "sigs.k8s.io/controller-runtime"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// reconcileNormal brings a live Proxy's instance to its spec: create,
// replace, or observe what runs.
func (r *Reconciler) reconcileNormal(ctx context.Context, s *scope) (ctrl.Result, error) {
	px := s.px
	if px.Status.Phase == "" {
		px.Status.Phase = v1.PhasePending
	}
	if px.Spec.Mode == v1.ModeExternal {
		return r.reconcileExternal(px)
	}
	return r.reconcileManaged(ctx, px)
}

func (r *Reconciler) reconcileExternal(px *v1.Proxy) (ctrl.Result, error) {
	// Each address is an instance of its own: what was proven of the old
	// one must not keep the new one leasable while the failure threshold
	// catches up, so a new address moves the generation, which is what
	// makes the health engine start over.
	st := &px.Status
	switch {
	case st.InstanceGeneration == 0:
		st.InstanceGeneration = 1
	case st.IP != "" && (st.IP != px.Spec.Address || st.Port != px.Spec.Port):
		st.InstanceGeneration++
	}
	markReady(px, v1.ReasonTracking, px.Spec.Address, fmt.Sprintf("tracking external proxy at %s:%d", px.Spec.Address, px.Spec.Port))
	return ctrl.Result{}, nil
}

func (r *Reconciler) reconcileManaged(ctx context.Context, px *v1.Proxy) (ctrl.Result, error) {
	prov, err := r.registry.Get(px.Spec.Provider)
	if err != nil {
		if providers.IsUnknownProvider(err) {
			return r.fail(px, v1.ReasonUnknownProvider, err.Error())
		}
		r.fail(px, v1.ReasonProviderUnavailable, err.Error())
		return ctrl.Result{RequeueAfter: r.backoff.When(px.Key())}, nil
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
		if wait := r.resync.wait(px.Key(), px.Spec.Provider); wait > 0 {
			return ctrl.Result{RequeueAfter: wait}, nil
		}
	}
	inst, err := prov.Get(ctx, st.ProviderID)
	switch {
	case providers.IsNotFound(err):
		markNotReady(px, v1.PhaseProvisioning, v1.ReasonInstanceLost, fmt.Sprintf("instance %s disappeared outside the controller; creating it again", st.ProviderID))
		// The next instance is a new generation, under a name of its own:
		// its health starts over, and should the lost one come back, GC
		// collects it as superseded.
		st.ProviderID, st.InstanceGeneration = "", max(st.InstanceGeneration, 1)+1
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
	markNotReady(px, v1.PhaseReplacing, v1.ReasonReplacing, fmt.Sprintf("placement, cloudInit or port changed: deleting %s before creating its replacement", st.ProviderID))
	inst, err := prov.Get(ctx, st.ProviderID)
	switch {
	case providers.IsNotFound(err):
		st.InstanceGeneration = max(st.InstanceGeneration, 1) + 1
		st.ProviderID, st.SpecHash = "", ""
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
	creds := r.opts.CredentialsKey.Derive(string(px.UID))
	inst, err := prov.Create(ctx, &providers.CreateRequest{
		Name:        providers.InstanceName(px.Name, px.UID, gen),
		Owner:       providers.Owner{UID: px.UID, Namespace: px.Namespace, Name: px.Name, Generation: gen},
		Placement:   placement,
		CloudInit:   creds.Expand(cloudInit),
		Port:        px.Spec.Port,
		Credentials: creds,
	})
	if err != nil {
		return r.providerError(px, err)
	}
	st.ProviderID, st.InstanceGeneration, st.SpecHash = inst.ProviderID, gen, hash
	return r.observe(ctx, px, prov, inst)
}

func (r *Reconciler) observe(ctx context.Context, px *v1.Proxy, prov providers.Provider, inst *providers.Instance) (ctrl.Result, error) {
	r.backoff.Forget(px.Key())
	switch {
	case inst.Ready():
		markReady(px, v1.ReasonRunning, inst.IP, fmt.Sprintf("instance %s running at %s:%d", inst.ProviderID, inst.IP, px.Spec.Port))
		return ctrl.Result{RequeueAfter: r.resync.next()}, nil
	case inst.State == providers.StateFailed:
		if err := prov.Delete(ctx, inst.ProviderID); err != nil {
			return r.providerError(px, err)
		}
		markNotReady(px, v1.PhaseProvisioning, v1.ReasonInstanceLost, fmt.Sprintf("instance %s failed; deleting it to create it again", inst.ProviderID))
	default:
		markNotReady(px, v1.PhaseProvisioning, v1.ReasonProvisioning, fmt.Sprintf("waiting for instance %s to run", inst.ProviderID))
	}
	return ctrl.Result{RequeueAfter: r.opts.PollInterval}, nil
}

// providerError turns a provider error into status and a retry policy.
func (r *Reconciler) providerError(px *v1.Proxy, err error) (ctrl.Result, error) {
	switch {
	case providers.IsInvalidConfig(err):
		return r.fail(px, v1.ReasonInvalidPlacement, err.Error())
	case providers.IsQuota(err):
		markError(px, v1.ReasonQuotaExceeded, "waiting for quota or capacity: "+err.Error())
		return ctrl.Result{RequeueAfter: r.backoff.When(px.Key())}, nil
	default:
		markError(px, v1.ReasonProviderError, err.Error())
		return ctrl.Result{}, err
	}
}

// fail records a condition no retry can fix until something changes (the
// spec, the Secret, the config); nothing is requeued.
func (r *Reconciler) fail(px *v1.Proxy, reason, msg string) (ctrl.Result, error) {
	markNotReady(px, v1.PhaseFailed, reason, msg)
	return ctrl.Result{}, nil
}
