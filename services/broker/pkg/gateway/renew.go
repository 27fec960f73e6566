package gateway

import (
	"context"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// renewer keeps the leases of live tunnels and requests alive, all from
// one loop: a goroutine or timer per tunnel would cost each idle tunnel
// more than the tunnel itself.
type renewer struct {
	clock clock.WithTicker

	mu   sync.Mutex
	live map[string]*held
}

// held is a lease in use: the caller to renew it as (its credential
// checked again at each renewal), how to end what uses it when it cannot
// be, and when it was last renewed.
type held struct {
	id      string
	caller  access.Caller
	end     func()
	renewed time.Time
}

func (r *renewer) hold(id string, caller access.Caller, end func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == nil {
		r.live = map[string]*held{}
	}
	r.live[id] = &held{id: id, caller: caller, end: end, renewed: r.clock.Now()}
}

func (r *renewer) drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, id)
}

// renewConcurrency bounds the renewals in flight at once.
const renewConcurrency = 64

// due are the leases last renewed before since, oldest first.
func (r *renewer) due(since time.Time) []*held {
	r.mu.Lock()
	var out []*held
	for _, h := range r.live {
		if h.renewed.Before(since) {
			out = append(out, h)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b *held) int { return a.renewed.Compare(b.renewed) })
	return out
}

// run renews each held lease once it is a third of ttl old, until ctx
// ends. Leases come due as their tunnels opened, so the work is spread
// over time rather than done for all at once; a round is bounded by a
// third of ttl, and what it did not reach (a slow store) is first in the
// next, while it still has two thirds of its ttl to live. A lease the
// API will not renew (gone, its proxy no longer leasable, its token
// revoked) ends what holds it; a failure that may pass (the store
// unavailable) is retried at the next round.
func (r *renewer) run(ctx context.Context, l Leaser, callers Callers, ttl time.Duration) {
	t := r.clock.NewTicker(min(ttl/6, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		r.round(ctx, l, callers, ttl)
	}
}

// round renews the leases that are due, within a third of ttl.
func (r *renewer) round(ctx context.Context, l Leaser, callers Callers, ttl time.Duration) {
	start := r.clock.Now()
	due := r.due(start.Add(-ttl / 3))
	if len(due) == 0 {
		return
	}
	defer func() { renewRounds.Observe(r.clock.Since(start).Seconds()) }()
	rctx, cancel := context.WithTimeout(ctx, ttl/3)
	defer cancel()
	sem := make(chan struct{}, renewConcurrency)
	var wg sync.WaitGroup
	for _, h := range due {
		select {
		case sem <- struct{}{}:
		case <-rctx.Done():
			wg.Wait()
			renewals.WithLabelValues("deferred").Add(float64(len(due)))
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			// The credential is asked about again: a removed one ends
			// what it opened now, not at the tunnel's timeout.
			c, err := callers.Recheck(h.caller, access.Gateway)
			if err == nil {
				_, err = l.RenewLease(rctx, c, &leasev1.RenewLeaseRequest{LeaseId: h.id, TtlSeconds: int32(ttl.Seconds())})
				access.Called(c, "RenewLease", err)
			}
			switch status.Code(err) {
			case codes.OK:
				renewals.WithLabelValues("renewed").Inc()
				r.mu.Lock()
				h.renewed = r.clock.Now()
				r.mu.Unlock()
			case codes.NotFound, codes.FailedPrecondition:
				renewals.WithLabelValues("ended").Inc()
				tunnelEnds.WithLabelValues("lease").Inc()
				h.end()
			case codes.Unauthenticated, codes.PermissionDenied:
				// The token was revoked: what it opened ends, and frees
				// its slots, now rather than at the tunnel's timeout.
				renewals.WithLabelValues("revoked").Inc()
				tunnelEnds.WithLabelValues("revoked").Inc()
				h.end()
			default:
				renewals.WithLabelValues("failed").Inc()
			}
		})
		due = due[1:]
	}
	wg.Wait()
}
