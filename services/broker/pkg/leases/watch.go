package leases

import (
	"context"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
)

// RunWatches serves WatchProxies until ctx ends; without it every watch
// is refused as unavailable.
func (s *Service) RunWatches(ctx context.Context) { s.hub.run(ctx) }

// views is the proxies' ListProxies form, with their lease state, by
// UID.
func (s *Service) views(ctx context.Context, ps []inventory.Proxy) (map[string]*leasev1.Proxy, error) {
	uids := make([]string, len(ps))
	for i, p := range ps {
		uids[i] = p.UID
	}
	states, err := s.store.States(ctx, "", "", uids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*leasev1.Proxy, len(ps))
	for _, p := range ps {
		out[p.UID] = toProto(p, states[p.UID])
	}
	return out, nil
}

// WatchProxies serves LeaseService.WatchProxies for c.
func (s *Service) WatchProxies(c access.Caller, req *leasev1.WatchProxiesRequest, stream grpc.ServerStreamingServer[leasev1.WatchProxiesResponse]) error {
	if err := firstErr(checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace())); err != nil {
		return err
	}
	if err := s.checkSynced(); err != nil {
		return err
	}
	t := c.Tenant
	ns, sel, err := t.Scope(req.GetNamespace(), req.GetSelector())
	if err != nil {
		return err
	}
	w, first, err := s.hub.subscribe(filter{namespaces: ns, selector: sel, healthy: req.Healthy}, t.Name,
		access.LimitOf(t.Quotas.MaxWatches, "maxWatches", s.cfg.TokenMaxWatches, "--token-max-watches"))
	if err != nil {
		return err
	}
	defer s.hub.unsubscribe(w)
	ctx := stream.Context()
	// The stream is written by one goroutine, each send timed; this one
	// ends the call when a send takes longer than cfg.WatchSendTimeout (quiet
	// gaps between sends are not timed: a quiet fleet is no stall), ends
	// the watch when its credential or scope changes, or returns when the
	// caller leaves.
	// sending is when the send in progress began (Unix nanoseconds), 0
	// between sends.
	var sending atomic.Int64
	send := func(r *leasev1.WatchProxiesResponse) error {
		sending.Store(time.Now().UnixNano())
		defer sending.Store(0)
		return stream.Send(r)
	}
	sent := make(chan error, 1)
	go func() { sent <- s.stream(ctx, w, first, send) }()
	sendTimeout, reauthorize := s.cfg.WatchSendTimeout, s.cfg.WatchReauthorize
	tick := time.NewTicker(min(sendTimeout/4, reauthorize))
	defer tick.Stop()
	authorized := time.Now()
	ended := w.ended
	for {
		select {
		case err := <-sent:
			return err
		case <-ended:
			// A gRPC stream ends here: its held send ends with the
			// handler. An Aborter's writer sends what it holds and then
			// the error itself (a stalled one is cut by the timer).
			if aborterOf(stream) == nil && w.err != nil {
				return w.err
			}
			ended = nil
		case <-tick.C:
			if began := sending.Load(); began != 0 && time.Since(time.Unix(0, began)) > sendTimeout {
				watchesEnded.WithLabelValues("stalled").Inc()
				return finish(stream, sent, status.Errorf(codes.DeadlineExceeded, "this watch took no batch for %s; watch again", sendTimeout))
			}
			if time.Since(authorized) >= reauthorize {
				authorized = time.Now()
				if err := s.reauthorize(c, req, w.filter); err != nil {
					watchesEnded.WithLabelValues("unauthorized").Inc()
					// The writer sends what it holds, then this error.
					s.hub.end(w, err)
				}
			}
		case <-ctx.Done():
			return finish(stream, sent, nil)
		}
	}
}

// reauthorize says why a watch opened with filter may no longer go on:
// its credential is gone or lost the watch verb, or its tenant's scope
// is no longer what the watch was opened with.
func (s *Service) reauthorize(c access.Caller, req *leasev1.WatchProxiesRequest, f filter) error {
	if s.cfg.Reauthorize == nil {
		return nil
	}
	t, err := s.cfg.Reauthorize(c)
	if err != nil {
		return err
	}
	ns, sel, err := t.Scope(req.GetNamespace(), req.GetSelector())
	if err != nil {
		return err
	}
	if !slices.Equal(ns, f.namespaces) || !maps.Equal(sel, f.selector) {
		return t.Denied("TENANT_SCOPE_CHANGED", "tenant %q's namespaces or selector changed since this watch began; watch again to see its scope now", t.Name)
	}
	return nil
}

// Aborter is a stream whose blocked Send another goroutine can end: the
// REST watch's (by its write deadline). A gRPC stream needs none: the
// handler's return ends a send that flow control holds.
type Aborter interface{ Abort() }

type aborterKey struct{}

// WithAborter marks ctx, a stream's, as one a can abort: the mark
// survives the interceptors' wrapping of the stream, which a type
// assertion on the stream would not.
func WithAborter(ctx context.Context, a Aborter) context.Context {
	return context.WithValue(ctx, aborterKey{}, a)
}

func aborterOf(stream grpc.ServerStream) Aborter {
	a, _ := stream.Context().Value(aborterKey{}).(Aborter)
	return a
}

// finish returns err once the stream's writer is done, where the stream
// can make it be: a handler that returned while its writer still wrote
// would leave two writers on one answer.
func finish(stream grpc.ServerStream, sent <-chan error, err error) error {
	if a := aborterOf(stream); a != nil {
		a.Abort()
		<-sent
	}
	return err
}

// stream sends w's starting set, the synced mark and then its changes
// until the hub ends it.
func (s *Service) stream(ctx context.Context, w *watch, first []inventory.Proxy, send func(*leasev1.WatchProxiesResponse) error) error {
	for page := range slices.Chunk(first, MaxPageSize) {
		views, err := s.views(ctx, page)
		if err != nil {
			return storeError(err)
		}
		evs := make([]*leasev1.ProxyEvent, len(page))
		for i, p := range page {
			evs[i] = &leasev1.ProxyEvent{Type: leasev1.ProxyEvent_TYPE_UPSERT, Proxy: views[p.UID]}
		}
		if err := send(&leasev1.WatchProxiesResponse{Events: evs}); err != nil {
			return err
		}
	}
	if err := send(&leasev1.WatchProxiesResponse{Events: []*leasev1.ProxyEvent{{Type: leasev1.ProxyEvent_TYPE_SYNCED}}}); err != nil {
		return err
	}
	for {
		// The caller leaving ends a wait for changes too: the handler
		// waits for this writer before it returns.
		select {
		case evs, ok := <-w.events:
			if !ok {
				return w.err
			}
			if err := send(&leasev1.WatchProxiesResponse{Events: evs}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
