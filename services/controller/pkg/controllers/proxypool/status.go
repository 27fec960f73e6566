package proxypool

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// setStatus derives the counts and conditions from what this reconcile
// observed and the plan it decided. A reason that needs someone to act is a Warning
// Event when it begins, not on every reconcile while it lasts.
func (r *Reconciler) setStatus(pool *v1.ProxyPool, l limits, o *observed, p plan, leasesKnown bool) {
	st := &pool.Status
	st.Replicas, st.ReadyReplicas, st.HealthyReplicas, st.UpdatedReplicas, st.DrainingReplicas = 0, 0, 0, 0, 0
	if leasesKnown {
		st.LeasedReplicas = 0
	}
	active, outdated, unhealthy, replacing := 0, 0, 0, 0
	for _, m := range o.members {
		if m.deleting {
			continue
		}
		st.Replicas++
		if m.ready {
			st.ReadyReplicas++
		}
		if m.healthy {
			st.HealthyReplicas++
		}
		if leasesKnown && m.leases > 0 {
			st.LeasedReplicas++
		}
		if m.draining() {
			st.DrainingReplicas++
			continue
		}
		active++
		if m.updated {
			st.UpdatedReplicas++
		} else {
			outdated++
		}
		if !m.healthy {
			unhealthy++
		}
		if c := p.verdicts[m.name].cause; m.updated && (c == CauseFailed || c == CauseMaxAge || c == CauseRollout) {
			replacing++
		}
	}
	st.Selector = labels.Set{v1.LabelPool: pool.Name}.String()

	reason, msg, progressing := v1.ReasonAsDesired, fmt.Sprintf("%d members, all up to date and healthy", active), false
	switch {
	case len(p.blocked) > 0:
		reason, msg = v1.ReasonDisruptionBlocked, fmt.Sprintf("members that must go are annotated %s: %s", v1.AnnotationDoNotDisrupt, strings.Join(p.blocked, ", "))
	case len(p.exhausted) > 0:
		reason, msg = v1.ReasonRetriesExhausted, "gave up replacing "+strings.Join(p.exhausted, "; ")
	case outdated > 0:
		reason, msg, progressing = v1.ReasonRollingOut, fmt.Sprintf("%d of %d members are made from an outdated template", outdated, active), true
	case replacing > 0:
		reason, msg, progressing = v1.ReasonReplacingMembers, fmt.Sprintf("%d members are being replaced (failed, past maxAge, or made before rolloutAfter)", replacing), true
	case active < l.replicas || len(p.creates) > 0:
		reason, msg, progressing = v1.ReasonScalingUp, fmt.Sprintf("%d of %d members exist", active, l.replicas), true
	case active > l.replicas || st.DrainingReplicas > 0:
		reason, msg, progressing = v1.ReasonScalingDown, fmt.Sprintf("%d members for %d replicas, %d draining", active, l.replicas, st.DrainingReplicas), true
	case unhealthy > 0:
		reason, msg = v1.ReasonMembersNotHealthy, fmt.Sprintf("%d of %d members are not Ready and Healthy", unhealthy, active)
	}
	was := meta.FindStatusCondition(st.Conditions, v1.ConditionReady)
	if v1.EventType(reason) == corev1.EventTypeWarning && (was == nil || was.Reason != reason) {
		r.recorder.Eventf(pool, nil, corev1.EventTypeWarning, reason, "Reconcile", "%s", msg)
	}
	ready := metav1.ConditionFalse
	if reason == v1.ReasonAsDesired {
		ready = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: ready, Reason: reason, Message: msg, ObservedGeneration: pool.Generation})
	prog := metav1.Condition{Type: v1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: pool.Generation}
	if progressing {
		prog.Status = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&st.Conditions, prog)

	paused := metav1.Condition{Type: v1.ConditionRemediationPaused, Status: metav1.ConditionFalse, Reason: v1.ReasonWithinMaxUnhealthy,
		Message: fmt.Sprintf("at most %d members may be replaced for failing at once", l.maxUnhealthy), ObservedGeneration: pool.Generation}
	if p.paused != "" {
		paused.Status, paused.Reason, paused.Message = metav1.ConditionTrue, v1.ReasonTooManyUnhealthy, p.paused
		if !meta.IsStatusConditionTrue(st.Conditions, v1.ConditionRemediationPaused) {
			r.recorder.Eventf(pool, nil, corev1.EventTypeWarning, v1.ReasonTooManyUnhealthy, "Remediate", "remediation paused: %s", p.paused)
		}
	}
	meta.SetStatusCondition(&st.Conditions, paused)
}
