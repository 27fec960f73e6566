package lifecycle

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/statuspatch"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
)

// The lifecycle writes phase, address, Ready, provider id, instance
// generation and spec hash; health is the health engine's (package
// health), which resets it when the instance generation moves on, so the
// lifecycle says a new instance exists by moving the generation.
//
// The phase, the Ready condition and the address change together, in
// markReady, markNotReady and markError and nowhere else, so no path can
// leave them disagreeing: a Proxy has an address in phase Ready, and
// loses it the moment it moves to any other phase.

// markReady: the instance runs and clients may connect to ip.
func markReady(px *v1.Proxy, reason, ip, msg string) {
	px.Status.Phase = v1.PhaseReady
	px.Status.IP, px.Status.Port = ip, px.Spec.Port
	setReady(px, metav1.ConditionTrue, reason, msg)
}

// markNotReady: the Proxy moves to phase, and clients stop seeing its
// address at once (an instance on its way out, one not yet up, a Proxy
// that cannot work).
func markNotReady(px *v1.Proxy, phase v1.ProxyPhase, reason, msg string) {
	px.Status.Phase = phase
	px.Status.IP = ""
	setReady(px, metav1.ConditionFalse, reason, msg)
}

// markError: a provider call failed or must wait. The instance is where
// it was, so phase and address stay, except that a Proxy that had not
// started (Pending) or had given up (Failed) is now trying: Provisioning.
func markError(px *v1.Proxy, reason, msg string) {
	if px.Status.Phase == v1.PhasePending || px.Status.Phase == v1.PhaseFailed {
		px.Status.Phase = v1.PhaseProvisioning
	}
	setReady(px, metav1.ConditionFalse, reason, msg)
}

func setReady(px *v1.Proxy, status metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: status, Reason: reason, Message: msg, ObservedGeneration: px.Generation,
	})
}

// patchStatus writes the status only when it changed, with an optimistic
// lock so a decision taken on a stale read never lands, and emits an Event
// for every change of the Ready condition. The generation is observed
// only by a reconcile that succeeded.
func (r *Reconciler) patchStatus(ctx context.Context, s *scope, succeeded bool) error {
	if s.released {
		return nil
	}
	wrote, err := statuspatch.New(v1.WriterLifecycle, r.client).Write(ctx, s.base, s.px, succeeded)
	if err != nil {
		return fmt.Errorf("patching status: %w", err)
	}
	if !wrote {
		return nil
	}
	metrics.StatusWrites.WithLabelValues(v1.WriterLifecycle.Name).Inc()
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
	r.recorder.Eventf(after, nil, v1.EventType(cur.Reason), cur.Reason, string(after.Status.Phase), "%s", cur.Message)
}
