package proxypool

import (
	"context"
	"fmt"
	"sync"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
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

// followers is the autoscaler's history of each pool, and the pools every
// poll of the broker wakes: those autoscaled and those draining members
// (a drain ends on a lease count read after it began).
type followers struct {
	mu      sync.Mutex
	history map[types.NamespacedName]*history
	pools   map[types.NamespacedName]bool
}

// follow says whether the pool wants every poll.
func (a *followers) follow(key types.NamespacedName, polls bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if polls {
		a.pools[key] = true
	} else {
		delete(a.pools, key)
	}
}

// maxSnapshotAge is how old a lease snapshot may be to scale on: older,
// the broker has not answered for several polls and demand is unknown.
const maxSnapshotAge = 30 * time.Second

// autoscale sets spec.replicas (through /scale, as an HPA would) from
// demand, and reports whether it did; when a scale-down waits for its
// window, wait says how long.
func (r *Reconciler) autoscale(ctx context.Context, pool *v1.ProxyPool, l limits, o *observed, snap leaseview.Snapshot, now time.Time) (scaled bool, wait time.Duration, err error) {
	key := types.NamespacedName{Namespace: pool.Namespace, Name: pool.Name}
	a := pool.Spec.Autoscaling
	if a == nil {
		r.polls.dropHistory(key)
		return false, 0, nil
	}
	if !snap.Known() || now.Sub(snap.At) > maxSnapshotAge {
		return false, 0, nil
	}
	b := bounds{min: int(a.MinReplicas), max: int(a.MaxReplicas), target: int(a.TargetLeasesPerProxy)}
	if b.target == 0 {
		b.target = defaultTargetLeases
	}
	d := demand{current: l.replicas, refused: snap.Refused(pool.Namespace, pool.Spec.Template.Spec.Attributes)}
	active := 0
	for _, m := range o.members {
		if !m.active() {
			continue
		}
		active++
		d.leases += int64(m.leases)
		if m.healthy {
			d.leasable++
		} else if m.updated && now.Sub(m.created) < l.startupTimeout {
			d.settling = true
		}
	}
	d.settling = d.settling || active < d.current

	rec, why := recommend(b, d)
	h := r.polls.historyOf(key, pool.UID)
	window := durationOr(a.ScaleDownStabilization, 5*time.Minute)
	top, full := h.stabilized(rec, now, window)
	next := d.current
	switch {
	case d.current < b.min || d.current > b.max:
		next = min(max(d.current, b.min), b.max)
		why = fmt.Sprintf("spec.replicas %d is outside minReplicas %d and maxReplicas %d", d.current, b.min, b.max)
	case rec > d.current && !d.settling:
		next = rec
	case top < d.current && full:
		next = top
		why += fmt.Sprintf("; the most asked for in the last %s", window)
	case rec < d.current:
		wait = h.lowerAt(rec, window).Sub(now) + 10*time.Millisecond
	}
	if next == d.current {
		return false, wait, nil
	}
	scale := &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: pool.Name, Namespace: pool.Namespace, ResourceVersion: pool.ResourceVersion},
		Spec:       autoscalingv1.ScaleSpec{Replicas: int32(next)},
	}
	if err := r.client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
		return false, 0, fmt.Errorf("scaling pool %s to %d: %w", pool.Name, next, err)
	}
	// A new size starts a new window: a scale-down waits a whole window
	// after any change.
	h.since, h.recs = now, nil
	r.recorder.Eventf(pool, nil, corev1.EventTypeNormal, v1.EventScaled, "Scale", "scaled from %d to %d members: %s", d.current, next, why)
	return true, 0, nil
}

// historyOf returns the pool's history, a new one for a pool new under
// its name. Only the pool's reconcile uses it, and a key never reconciles
// twice at once, so the lock guards the map only.
func (a *followers) historyOf(key types.NamespacedName, uid types.UID) *history {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.history[key]
	if h == nil || h.uid != uid {
		h = &history{uid: uid}
		a.history[key] = h
	}
	return h
}

func (a *followers) dropHistory(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.history, key)
}

// forget drops a deleted pool.
func (a *followers) forget(key types.NamespacedName) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pools, key)
	delete(a.history, key)
}

// Polled wakes every pool that follows the polls: demand may have
// changed for any, and a drain may have ended. It is leaseview.Poller's
// Polled hook, and never blocks.
func (r *Reconciler) Polled() {
	r.polls.mu.Lock()
	keys := make([]types.NamespacedName, 0, len(r.polls.pools))
	for key := range r.polls.pools {
		keys = append(keys, key)
	}
	r.polls.mu.Unlock()
	for _, key := range keys {
		r.wakePool(key)
	}
}
