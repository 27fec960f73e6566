package proxysource

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
)

// syncTimeEvery is how stale status.lastSyncTime may be.
const syncTimeEvery = time.Minute

// setStatus derives the source's status from the read, the members and
// the plan just executed: what the members are once its writes land.
func setStatus(src *v1.ProxySource, rd sourceRead, desired map[string]Entry, proxies map[string]*v1.Proxy, p plan) {
	got, readErr, readAt := rd.parsed, rd.err, rd.at
	st := &src.Status
	gone := map[string]bool{}
	for _, name := range p.delete {
		gone[name] = true
	}
	present, healthy := len(p.create), 0
	for _, px := range proxies {
		if !px.DeletionTimestamp.IsZero() || gone[px.Name] {
			continue
		}
		present++
		if px.IsReady() && px.Status.IsHealthy() {
			healthy++
		}
	}
	st.Present, st.Healthy = int32(present), int32(healthy)
	st.Draining = int32(p.draining - countGoneDraining(proxies, gone))
	st.HeldShrink = nil
	if p.held != nil {
		st.HeldShrink = &v1.HeldShrink{From: int32(p.held.from), To: int32(p.held.to)}
	}

	synced := metav1.Condition{Type: v1.ConditionSynced, ObservedGeneration: src.Generation}
	switch {
	case readErr != nil:
		// A URL's user name and password are in its errors; the
		// condition, and the Event made of it, are read more widely.
		synced.Status, synced.Reason, synced.Message = metav1.ConditionFalse, v1.ReasonFetchFailed, sanitize.Userinfo(readErr.Error())+"; no member was changed"
	case desired == nil:
		st.Rejected, st.RejectedEntries = int32(got.Rejected()), got.rejected
		synced.Status, synced.Reason = metav1.ConditionFalse, v1.ReasonNoValidEntries
		synced.Message = fmt.Sprintf("none of the %d entries is valid, so no member was changed: %s", got.Rejected(), strings.Join(got.rejected, "; "))
	default:
		// A read from the cache happens on every reconcile; its time is
		// written when it says something: a change, or a minute on.
		if last := st.LastSyncTime; last == nil || readAt.Sub(last.Time) >= syncTimeEvery || st.Desired != int32(len(desired)) {
			at := metav1.NewTime(readAt)
			st.LastSyncTime = &at
		}
		st.Desired = int32(len(desired))
		st.Rejected, st.RejectedEntries = int32(got.Rejected()), got.rejected
		synced.Status, synced.Reason = metav1.ConditionTrue, v1.ReasonSourceApplied
		synced.Message = fmt.Sprintf("%d entries applied", len(desired))
		if got.over > 0 {
			synced.Message += fmt.Sprintf("; %d more entries are past spec.maxEntries (%d) and were not read", got.over, got.limit)
		}
		if p.pending > 0 {
			synced.Message += fmt.Sprintf("; %d new members are created per sync, %d wait for the next", createsPerSync, p.pending)
		}
		if got.Rejected() > 0 {
			synced.Message += fmt.Sprintf("; %d rejected: %s", got.Rejected(), strings.Join(got.rejected, "; "))
		}
		if h := p.held; h != nil {
			synced.Status, synced.Reason = metav1.ConditionFalse, v1.ReasonShrinkHeld
			synced.Message = fmt.Sprintf("the source lists %d entries where %d members are: more than spec.maxShrinkPercent would go at once, so none is taken out (new entries are added); annotate %s=%d to apply it",
				h.to, h.from, v1.AnnotationConfirmShrink, h.to)
		}
	}
	meta.SetStatusCondition(&st.Conditions, synced)

	ready := metav1.Condition{Type: v1.ConditionReady, ObservedGeneration: src.Generation, Status: metav1.ConditionFalse}
	switch {
	case st.LastSyncTime == nil:
		ready.Reason, ready.Message = synced.Reason, "the source has not been read yet: "+synced.Message
	case st.Draining > 0:
		ready.Reason, ready.Message = v1.ReasonMembersDraining, fmt.Sprintf("%d members that left the source wait for their leases to end", st.Draining)
	case int(st.Healthy) < int(st.Desired) || st.Present != st.Desired:
		ready.Reason, ready.Message = v1.ReasonMembersNotHealthy, fmt.Sprintf("%d of %d entries have a healthy member", st.Healthy, st.Desired)
	default:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionTrue, v1.ReasonAsDesired, fmt.Sprintf("every one of %d entries has a healthy member", st.Desired)
	}
	meta.SetStatusCondition(&st.Conditions, ready)
}

func countGoneDraining(proxies map[string]*v1.Proxy, gone map[string]bool) int {
	n := 0
	for name := range gone {
		if px := proxies[name]; px != nil {
			if _, ok := px.DrainDeadline(); ok {
				n++
			}
		}
	}
	return n
}
