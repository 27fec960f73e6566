package leases

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

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
