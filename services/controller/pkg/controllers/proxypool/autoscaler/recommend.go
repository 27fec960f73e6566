package autoscaler

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// demand is what the autoscaler sees of a pool.
type demand struct {
	current int // spec.replicas
	// leasable members (active, Ready and Healthy) and the live leases
	// on active members.
	leasable int
	leases   int64
	// refused counts leases refused in the last window (every match at
	// its cap or cooling down) that a member would have matched.
	refused int64
	// settling: members of an earlier scale-up are still coming up.
	settling bool
}

type bounds struct{ min, max, target int }

const defaultTargetLeases = 5

// recommend is the size demand asks for, within the bounds, and the
// figures that say why. Live leases ask for leases/target members;
// refusals, which mean the members there are all taken, ask for half as
// many again as there are.
func recommend(b bounds, d demand) (int, string) {
	need := int((d.leases + int64(b.target) - 1) / int64(b.target))
	why := fmt.Sprintf("%d live leases on %d leasable members, target %d per member", d.leases, d.leasable, b.target)
	if d.refused > 0 {
		need = max(need, d.current+max(1, d.current/2))
		why += fmt.Sprintf("; %d leases refused in the last %s, every matching member at its cap or cooling down", d.refused, leaseview.RefusalWindow)
	}
	return min(max(need, b.min), b.max), why
}

// history keeps one pool's recommendations over its stabilization window,
// in memory: after a restart the window starts again, which only delays
// a scale-down.
type history struct {
	uid   types.UID // a pool re-created under the name starts afresh
	since time.Time
	recs  []recommendation
}

type recommendation struct {
	at time.Time
	n  int
}

// stabilized records rec at now and returns the largest recommendation
// of the window, and whether the history spans the whole window.
func (h *history) stabilized(rec int, now time.Time, window time.Duration) (int, bool) {
	if h.since.IsZero() {
		h.since = now
	}
	h.recs = append(h.recs, recommendation{now, rec})
	keep := h.recs[:0]
	top := 0
	for _, r := range h.recs {
		if now.Sub(r.at) <= window {
			keep = append(keep, r)
			top = max(top, r.n)
		}
	}
	h.recs = keep
	return top, now.Sub(h.since) >= window
}

// lowerAt is when the window will have asked for no more than rec, if
// demand stays as it is: once it spans the whole window, and the last
// larger recommendation has left it.
func (h *history) lowerAt(rec int, window time.Duration) time.Time {
	at := h.since.Add(window)
	for _, r := range h.recs {
		if r.n > rec && r.at.Add(window).After(at) {
			at = r.at.Add(window)
		}
	}
	return at
}

// decide is the size to scale to now, and why; when a scale-down waits
// for the window to pass, wait says how long. Above current it scales up
// at once, unless members of an earlier scale-up are still settling;
// below, only once the whole window asked for no more.
func (h *history) decide(b bounds, d demand, rec int, why string, now time.Time, window time.Duration) (next int, reason string, wait time.Duration) {
	top, full := h.stabilized(rec, now, window)
	switch {
	case d.current < b.min || d.current > b.max:
		return min(max(d.current, b.min), b.max), fmt.Sprintf("spec.replicas %d is outside minReplicas %d and maxReplicas %d", d.current, b.min, b.max), 0
	case rec > d.current && !d.settling:
		return rec, why, 0
	case top < d.current && full:
		return top, why + fmt.Sprintf("; the most asked for in the last %s", window), 0
	case rec < d.current:
		return d.current, why, h.lowerAt(rec, window).Sub(now) + 10*time.Millisecond
	}
	return d.current, why, 0
}

// restart begins a new window at now: a scale-down waits a whole window
// after any change of size.
func (h *history) restart(now time.Time) {
	h.since, h.recs = now, nil
}
