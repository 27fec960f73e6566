package memberset

// A drain is how a member is taken out without cutting its crawlers off:
// mark it with a drain deadline (the brokers stop leasing it and renew
// nothing past the deadline), then delete it once it holds no live lease
// on a count read after the brokers could have seen the mark, or at the
// deadline. The owner decides when (DrainEnded, NextDrainCheck); the set marks
// (Set.Apply's drains) and takes the mark back (its undrains).

import (
	"context"
	"fmt"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// DefaultMarkLag is how long after a drain begins a lease count must have
// been read to end it: brokers stop leasing a draining proxy only once
// their informers have seen the mark.
const DefaultMarkLag = 2 * time.Second

// MaxPoll bounds how long a drain goes unchecked when nothing wakes its
// owner (the broker does not answer).
const MaxPoll = 10 * time.Second

// DrainDeadline is when a drain of timeout begun at now ends, rounded up to
// the annotation's whole seconds, so the start derived from it (deadline
// − timeout) is never before the real one and the mark lag is never
// cut short.
func DrainDeadline(now time.Time, timeout time.Duration) time.Time {
	return now.Add(timeout + time.Second - 1).Truncate(time.Second)
}

// beginDrain marks px draining until deadline, under optimistic lock (a
// decision on a stale read loses), and returns it as written.
func beginDrain(ctx context.Context, c client.Client, px *v1.Proxy, deadline time.Time) (*v1.Proxy, error) {
	next := px.DeepCopy()
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	next.Annotations[v1.AnnotationDrainDeadline] = deadline.UTC().Format(time.RFC3339)
	if err := c.Patch(ctx, next, client.MergeFromWithOptions(px, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, fmt.Errorf("marking it draining: %w", err)
	}
	return next, nil
}

// DrainEnded says whether a drain until deadline of timeout is over at now:
// timedOut at the deadline, or done when leases, read at leasesAt, is 0
// and was read at least markLag after the drain began (brokers stop
// leasing a draining proxy only once their informers have seen the
// mark).
func DrainEnded(deadline time.Time, timeout, markLag time.Duration, leases int32, leasesAt, now time.Time) (timedOut, done bool) {
	if !now.Before(deadline) {
		return true, true
	}
	started := deadline.Add(-timeout)
	return false, leases == 0 && !leasesAt.Before(started.Add(markLag))
}

// NextDrainCheck is how soon a drain must be looked at again when nothing
// else wakes its owner: when its mark lag has passed, at its deadline,
// and at least every MaxPoll.
func NextDrainCheck(deadline time.Time, timeout, markLag time.Duration, now time.Time) time.Duration {
	next := min(deadline.Sub(now), MaxPoll)
	if seen := deadline.Add(-timeout + markLag); seen.After(now) {
		next = min(next, seen.Sub(now))
	}
	return max(next, 100*time.Millisecond)
}
