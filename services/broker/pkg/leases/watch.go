package leases

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
)

// WatchBacklog is how many batches of changes a watch may have unsent
// before it is ended: a watcher that stops reading must not hold the
// broker's memory, nor slow the others.
const WatchBacklog = 256

// filter is what one watch asks for.
type filter struct {
	namespaces []string
	selector   map[string]string
	healthy    *bool
}

func (f filter) matches(p inventory.Proxy) bool {
	return p.Selected(f.namespaces, f.selector, f.healthy)
}

// sameView says whether a watcher sees a and b alike.
func sameView(a, b inventory.Proxy) bool {
	return a.ID == b.ID && a.IP == b.IP && a.Port == b.Port && a.EgressIP == b.EgressIP && a.Healthy == b.Healthy &&
		a.Reason == b.Reason && a.Pool == b.Pool && maps.Equal(a.Attributes, b.Attributes)
}

// watch is one open WatchProxies stream, as the hub sees it.
type watch struct {
	filter filter
	caller string
	events chan []*leasev1.ProxyEvent
	// ended is closed when the hub ends the watch; err says why.
	ended chan struct{}
	err   error
}

// hub fans the broker's view of the fleet out to every watch: it keeps
// one copy of the inventory as the watches were told it, and on each
// change sends each watch what changed in its set, with the changed
// proxies' lease state read from Redis once for all watches.
type hub struct {
	inv *inventory.Inventory
	// views is the proxies as a list shows them, with their lease state,
	// by UID.
	views func(context.Context, []inventory.Proxy) (map[string]*leasev1.Proxy, error)
	log   *slog.Logger

	mu sync.Mutex
	// ready: told holds the inventory (taken once it synced); stopped:
	// the broker is stopping, and every watch has ended.
	ready, stopped bool
	told           map[string]inventory.Proxy // by UID
	watches        map[*watch]struct{}
	perCaller      map[string]int

	// dirty is the inventory's event path: it has a lock of its own, so
	// a fan-out to many watches never holds up the inventory's informer.
	dirtyMu sync.Mutex
	dirty   map[string]struct{}
	wake    chan struct{}
}

func newHub(inv *inventory.Inventory, views func(context.Context, []inventory.Proxy) (map[string]*leasev1.Proxy, error)) *hub {
	h := &hub{inv: inv, views: views, log: slog.Default(), told: map[string]inventory.Proxy{}, watches: map[*watch]struct{}{},
		perCaller: map[string]int{}, dirty: map[string]struct{}{}, wake: make(chan struct{}, 1)}
	inv.OnChange(h.changed)
	return h
}

func (h *hub) changed(uid string) {
	h.dirtyMu.Lock()
	h.dirty[uid] = struct{}{}
	h.dirtyMu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// readyLocked takes the inventory as the starting point once it has
// synced, and says whether it has.
func (h *hub) readyLocked() bool {
	if !h.ready && !h.stopped && h.inv.Synced() {
		h.dirtyMu.Lock()
		clear(h.dirty)
		h.dirtyMu.Unlock()
		for _, p := range h.inv.Select(nil, nil, nil, false) {
			h.told[p.UID] = p
		}
		h.ready = true
	}
	return h.ready
}

// run sends changes until ctx ends, then ends every watch.
func (h *hub) run(ctx context.Context) {
	defer h.close(status.Error(codes.Unavailable, "the broker is stopping; watch again"))
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.wake:
		case <-retry.C:
		}
		if err := h.send(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("reading lease state for watched proxies; retrying", "err", err)
			retry.Reset(time.Second)
		}
	}
}

// send turns the changes since the last send into each watch's events.
func (h *hub) send(ctx context.Context) error {
	h.mu.Lock()
	ready := h.readyLocked()
	h.mu.Unlock()
	if !ready {
		return nil
	}
	h.dirtyMu.Lock()
	dirty := slices.Sorted(maps.Keys(h.dirty))
	clear(h.dirty)
	h.dirtyMu.Unlock()
	if len(dirty) == 0 {
		return nil
	}
	now := map[string]inventory.Proxy{}
	var present []inventory.Proxy
	for _, uid := range dirty {
		if p, ok := h.inv.Get(uid); ok {
			now[uid] = p
			present = append(present, p)
		}
	}
	// Read outside the lock: a slow Redis delays watches, not changes.
	// The views are of the same snapshot the filters judge.
	views, err := h.views(ctx, present)
	if err != nil {
		h.dirtyMu.Lock()
		for _, uid := range dirty {
			h.dirty[uid] = struct{}{}
		}
		h.dirtyMu.Unlock()
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watches {
		var evs []*leasev1.ProxyEvent
		for _, uid := range dirty {
			old, was := h.told[uid]
			was = was && w.filter.matches(old)
			cur, is := now[uid]
			is = is && w.filter.matches(cur)
			switch {
			case is && (!was || !sameView(old, cur)):
				evs = append(evs, &leasev1.ProxyEvent{Type: leasev1.ProxyEvent_TYPE_UPSERT, Proxy: views[uid]})
			case was && !is:
				evs = append(evs, &leasev1.ProxyEvent{Type: leasev1.ProxyEvent_TYPE_DELETE, Proxy: &leasev1.Proxy{Id: old.ID}})
			}
		}
		if len(evs) == 0 {
			continue
		}
		select {
		case w.events <- evs:
		default:
			watchesEnded.WithLabelValues("behind").Inc()
			h.endLocked(w, status.Errorf(codes.ResourceExhausted, "this watch fell %d batches of changes behind; watch again", WatchBacklog))
		}
	}
	for _, uid := range dirty {
		if p, ok := now[uid]; ok {
			h.told[uid] = p
		} else {
			delete(h.told, uid)
		}
	}
	return nil
}

// subscribe opens a watch and returns the set it starts from, sorted by
// id; every change after that set comes on the watch's events.
func (h *hub) subscribe(f filter, caller string, limit access.Limit) (*watch, []inventory.Proxy, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.readyLocked() {
		return nil, nil, status.Error(codes.Unavailable, "the broker has not synced the fleet yet, or is stopping")
	}
	if limit.N > 0 && caller != "" && h.perCaller[caller] >= limit.N {
		return nil, nil, overQuota(caller, "watches", "TOKEN_WATCH_CAP",
			fmt.Sprintf("tenant %q holds its %d watches on this broker (%s); end one, or share one watch among a process's callers", caller, limit.N, limit.Source), 0)
	}
	w := &watch{filter: f, caller: caller, events: make(chan []*leasev1.ProxyEvent, WatchBacklog), ended: make(chan struct{})}
	h.watches[w] = struct{}{}
	h.perCaller[caller]++
	watchers.Inc()
	var first []inventory.Proxy
	for _, p := range h.told {
		if f.matches(p) {
			first = append(first, p)
		}
	}
	sort.Slice(first, func(i, j int) bool { return first[i].ID < first[j].ID })
	return w, first, nil
}

func (h *hub) unsubscribe(w *watch) { h.end(w, nil) }

// end ends w: its writer sends what it holds, then err.
func (h *hub) end(w *watch, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(w, err)
}

func (h *hub) endLocked(w *watch, err error) {
	if _, ok := h.watches[w]; !ok {
		return
	}
	delete(h.watches, w)
	if h.perCaller[w.caller]--; h.perCaller[w.caller] <= 0 {
		delete(h.perCaller, w.caller)
	}
	watchers.Dec()
	w.err = err
	close(w.events)
	close(w.ended)
}

func (h *hub) close(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.watches {
		h.endLocked(w, err)
	}
	h.ready, h.stopped = false, true
}

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
