package gateway

import (
	"context"
	"maps"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// renewer keeps the leases of live tunnels and requests alive, all from
// one loop: a goroutine or timer per tunnel would cost each idle tunnel
// more than the tunnel itself.
type renewer struct {
	mu   sync.Mutex
	live map[string]held
}

// held is a lease in use: the caller's credentials to renew it with, and
// how to end what uses it when it cannot be.
type held struct {
	md  metadata.MD
	end func()
}

func (r *renewer) hold(id string, md metadata.MD, end func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.live == nil {
		r.live = map[string]held{}
	}
	r.live[id] = held{md, end}
}

func (r *renewer) drop(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, id)
}

// renewConcurrency bounds the renewals in flight at once.
const renewConcurrency = 16

// run renews every held lease each third of ttl until ctx ends. A lease
// the API will not renew (gone, its proxy no longer leasable) ends what
// holds it; a failure that may pass (the store unavailable) is retried
// at the next round, within the lease's remaining two thirds.
func (r *renewer) run(ctx context.Context, l Leaser, ttl time.Duration) {
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.mu.Lock()
		live := maps.Clone(r.live)
		r.mu.Unlock()
		sem := make(chan struct{}, renewConcurrency)
		var wg sync.WaitGroup
		for id, h := range live {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				cctx, cancel := context.WithTimeout(metadata.NewIncomingContext(ctx, h.md), ttl/3)
				defer cancel()
				_, err := l.RenewLease(cctx, &leasev1.RenewLeaseRequest{LeaseId: id, TtlSeconds: int32(ttl.Seconds())})
				switch status.Code(err) {
				case codes.OK:
					renewals.WithLabelValues("renewed").Inc()
				case codes.NotFound, codes.FailedPrecondition:
					renewals.WithLabelValues("ended").Inc()
					h.end()
				default:
					renewals.WithLabelValues("failed").Inc()
				}
			})
		}
		wg.Wait()
	}
}
