package leases

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
)

// WatchBacklog is how many batches of changes a watch may have unsent
// before it is ended: a watcher that stops reading must not hold the
// broker's memory, nor slow the others.
const WatchBacklog = 256

// filter is what one watch asks for.
type filter struct {
	namespace string
	selector  map[string]string
	healthy   *bool
}

func (f filter) matches(p inventory.Proxy) bool {
	return p.Selected(f.namespace, f.selector, f.healthy)
}

// sameView says whether a watcher sees a and b alike.
func sameView(a, b inventory.Proxy) bool {
	return a.ID == b.ID && a.IP == b.IP && a.Port == b.Port && a.EgressIP == b.EgressIP && a.Healthy == b.Healthy &&
		maps.Equal(a.Attributes, b.Attributes)
}

// watch is one open WatchProxies stream, as the hub sees it.
type watch struct {
	filter filter
	events chan []*leasev1.ProxyEvent
	// err ends the stream once events is closed.
	err error
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
	dirty          map[string]struct{}
	wake           chan struct{}
}

func newHub(inv *inventory.Inventory, views func(context.Context, []inventory.Proxy) (map[string]*leasev1.Proxy, error)) *hub {
	h := &hub{inv: inv, views: views, log: slog.Default(), told: map[string]inventory.Proxy{}, watches: map[*watch]struct{}{},
		dirty: map[string]struct{}{}, wake: make(chan struct{}, 1)}
	inv.OnChange(h.changed)
	return h
}

func (h *hub) changed(uid string) {
	h.mu.Lock()
	h.dirty[uid] = struct{}{}
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// readyLocked takes the inventory as the starting point once it has
// synced, and says whether it has.
func (h *hub) readyLocked() bool {
	if !h.ready && !h.stopped && h.inv.Synced() {
		for _, p := range h.inv.Select("", nil, nil, false) {
			h.told[p.UID] = p
		}
		clear(h.dirty)
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
	if !h.readyLocked() {
		h.mu.Unlock()
		return nil
	}
	dirty := slices.Sorted(maps.Keys(h.dirty))
	clear(h.dirty)
	h.mu.Unlock()
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
		h.mu.Lock()
		for _, uid := range dirty {
			h.dirty[uid] = struct{}{}
		}
		h.mu.Unlock()
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
			watchesEnded.Inc()
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
func (h *hub) subscribe(f filter) (*watch, []inventory.Proxy, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.readyLocked() {
		return nil, nil, status.Error(codes.Unavailable, "the broker has not synced the fleet yet, or is stopping")
	}
	w := &watch{filter: f, events: make(chan []*leasev1.ProxyEvent, WatchBacklog)}
	h.watches[w] = struct{}{}
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

func (h *hub) unsubscribe(w *watch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.endLocked(w, nil)
}

func (h *hub) endLocked(w *watch, err error) {
	if _, ok := h.watches[w]; !ok {
		return
	}
	delete(h.watches, w)
	watchers.Dec()
	w.err = err
	close(w.events)
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
	states, err := s.store.States(ctx, "", uids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*leasev1.Proxy, len(ps))
	for _, p := range ps {
		out[p.UID] = toProto(p, states[p.UID])
	}
	return out, nil
}

// WatchProxies implements LeaseService.
func (s *Service) WatchProxies(req *leasev1.WatchProxiesRequest, stream grpc.ServerStreamingServer[leasev1.WatchProxiesResponse]) error {
	if err := firstErr(checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace())); err != nil {
		return err
	}
	if err := s.checkSynced(); err != nil {
		return err
	}
	w, first, err := s.hub.subscribe(filter{namespace: req.GetNamespace(), selector: req.GetSelector(), healthy: req.Healthy})
	if err != nil {
		return err
	}
	defer s.hub.unsubscribe(w)
	ctx := stream.Context()
	for page := range slices.Chunk(first, MaxPageSize) {
		views, err := s.views(ctx, page)
		if err != nil {
			return storeError(err)
		}
		evs := make([]*leasev1.ProxyEvent, len(page))
		for i, p := range page {
			evs[i] = &leasev1.ProxyEvent{Type: leasev1.ProxyEvent_TYPE_UPSERT, Proxy: views[p.UID]}
		}
		if err := stream.Send(&leasev1.WatchProxiesResponse{Events: evs}); err != nil {
			return err
		}
	}
	if err := stream.Send(&leasev1.WatchProxiesResponse{Events: []*leasev1.ProxyEvent{{Type: leasev1.ProxyEvent_TYPE_SYNCED}}}); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case evs, ok := <-w.events:
			if !ok {
				return w.err
			}
			if err := stream.Send(&leasev1.WatchProxiesResponse{Events: evs}); err != nil {
				return err
			}
		}
	}
}
