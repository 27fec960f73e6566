// Package index keeps the lease store's selector indexes in step with the
// broker's inventory. An index is the set of leasable proxies one selector
// (namespace and attribute pairs) matches, ordered in Redis by load; a
// lease request reads only its own index, so its cost does not grow with
// the fleet. Indexes are built the first time a selector is asked for,
// kept current from the inventory's events by every broker replica (the
// writes are idempotent), checked against the inventory every Resync, and
// dropped when idle.
package index

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Selector is what a lease request asks for.
type Selector struct {
	// Scope is the broker's --namespace: brokers serving different
	// namespaces may share a Redis, and must not share indexes.
	Scope string `json:"scope,omitempty"`
	// Namespaces, sorted, are where its proxies may be; nil: every one.
	Namespaces []string          `json:"namespaces,omitempty"`
	Labels     map[string]string `json:"selector,omitempty"`
}

// Key names the selector's index: equal selectors have equal keys, on
// every broker. It runs on every lease, so it hashes a quoted rendering
// rather than marshalling JSON.
func (s Selector) Key() string {
	labels := make([]string, 0, len(s.Labels))
	for k := range s.Labels {
		labels = append(labels, k)
	}
	sort.Strings(labels)
	h := sha256.New()
	// One namespace quotes as the single namespace of earlier versions
	// did, so their indexes keep their keys.
	buf := strconv.AppendQuote(strconv.AppendQuote(make([]byte, 0, 128), s.Scope), strings.Join(s.Namespaces, ","))
	for _, k := range labels {
		buf = strconv.AppendQuote(strconv.AppendQuote(buf, k), s.Labels[k])
	}
	h.Write(buf)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Matches reports whether p belongs in the selector's index.
func (s Selector) Matches(p inventory.Proxy) bool {
	return p.Leasable && p.Matches(s.Namespaces, s.Labels)
}

// Defaults for Maintainer.
const (
	DefaultResync     = 30 * time.Second
	DefaultIdle       = time.Hour
	DefaultMaxIndexes = 256
)

// Maintainer builds and maintains the indexes.
type Maintainer struct {
	Inv   *inventory.Inventory
	Store *store.Store
	Log   *slog.Logger
	// Scope is the broker's --namespace ("" for all).
	Scope string
	// SecretNamespaces are where the inventory reads Proxies' credentials
	// Secrets (all when empty).
	SecretNamespaces []string
	// NoSecrets: the inventory reads no Secret (--credentials-secrets=false).
	NoSecrets bool
	// Resync is how often every index is checked against the inventory
	// and the state of deleted proxies is dropped; Idle is how long an
	// unused index lives; MaxIndexes bounds how many exist at once (each
	// lease change updates every index holding the proxy), the least
	// recently used going first.
	Resync, Idle time.Duration
	MaxIndexes   int
	// Clock says when an index was used and whether it is idle; nil is
	// the wall clock. Tests step a fake one.
	Clock clock.PassiveClock

	once sync.Once
	// used holds, per key leased from since the last resync, when it was
	// last used (unix ms, an *atomic.Int64): resync records it, so the
	// least recently used index is known whenever resyncs run.
	used sync.Map
	// writing serializes building an index with applying a change, so a
	// change read before the build cannot land after it and undo it.
	writing sync.Mutex
	mu      sync.RWMutex
	known   map[string]Selector
	dirty   map[string]struct{}
	wake    chan struct{}
	build   singleflight.Group
	missing map[string]bool // UIDs in the store but not the inventory at the last resync
}

func (m *Maintainer) init() {
	m.once.Do(func() {
		m.known, m.dirty, m.wake, m.missing = map[string]Selector{}, map[string]struct{}{}, make(chan struct{}, 1), map[string]bool{}
		if m.Clock == nil {
			m.Clock = clock.RealClock{}
		}
	})
}

// Changed marks a proxy for an update; the inventory calls it on every
// change. It never blocks.
func (m *Maintainer) Changed(uid string) {
	m.init()
	m.mu.Lock()
	m.dirty[uid] = struct{}{}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Ensure returns the key of sel's index, building the index from the
// inventory if no broker has yet.
func (m *Maintainer) Ensure(ctx context.Context, sel Selector) (string, error) {
	m.init()
	sel.Scope = m.Scope
	key := sel.Key()
	at, ok := m.used.Load(key)
	if !ok {
		at, _ = m.used.LoadOrStore(key, new(atomic.Int64))
	}
	at.(*atomic.Int64).Store(m.Clock.Now().UnixMilli())
	m.mu.RLock()
	_, ok = m.known[key]
	m.mu.RUnlock()
	if ok {
		return key, nil
	}
	_, err, _ := m.build.Do(key, func() (any, error) {
		m.writing.Lock()
		defer m.writing.Unlock()
		def, _ := json.Marshal(sel)
		if err := m.Store.Join(ctx, string(def), m.members(sel), []string{key}); err != nil {
			return nil, err
		}
		m.mu.Lock()
		m.known[key] = sel
		m.mu.Unlock()
		indexesBuilt.Inc()
		return nil, nil
	})
	return key, err
}

// Holds reports whether this broker knows sel's index already: a lease
// on it builds nothing.
func (m *Maintainer) Holds(sel Selector) bool {
	m.init()
	sel.Scope = m.Scope
	m.mu.RLock()
	_, ok := m.known[sel.Key()]
	m.mu.RUnlock()
	return ok
}

// IdleTime is how long an unused index lives.
func (m *Maintainer) IdleTime() time.Duration { return m.Idle }

// Forget drops what this broker knows of an index (the store no longer
// has it), so the next Ensure rebuilds it.
func (m *Maintainer) Forget(key string) {
	m.init()
	m.mu.Lock()
	delete(m.known, key)
	m.mu.Unlock()
}

func (m *Maintainer) members(sel Selector) []store.Member {
	var out []store.Member
	for _, p := range m.Inv.Select(sel.Namespaces, sel.Labels, nil, true) {
		out = append(out, member(p))
	}
	return out
}

func member(p inventory.Proxy) store.Member {
	return store.Member{UID: p.UID, Namespace: p.Namespace, Addr: p.Addr(), EgressIP: p.EgressIP, HealthySince: p.HealthySince}
}

// Start watches the Proxies of m's scope through cfg into a new
// inventory, feeds its changes to m, and runs m until ctx ends. It returns
// the inventory once its informer runs; Synced says when the first list
// has arrived.
func (m *Maintainer) Start(ctx context.Context, cfg *rest.Config) (*inventory.Inventory, error) {
	m.Inv = inventory.New(m.Changed)
	if err := m.Inv.Run(ctx, cfg, m.Scope, m.SecretNamespaces, !m.NoSecrets); err != nil {
		return nil, err
	}
	go m.Run(ctx)
	return m.Inv, nil
}

// Run applies changes as they come and resyncs every Resync, until ctx
// ends. Redis failures are retried; they only delay index updates, and a
// lease that lands on a proxy this broker no longer finds leasable is
// handed back by the caller.
func (m *Maintainer) Run(ctx context.Context) {
	m.init()
	resync := time.NewTicker(m.Resync)
	defer resync.Stop()
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.wake:
		case <-retry.C:
		case <-resync.C:
			if m.Inv.Synced() {
				if err := m.resync(ctx); err != nil && ctx.Err() == nil {
					m.Log.Warn("resyncing the selector indexes", "err", err)
				}
			}
		}
		if err := m.flush(ctx); err != nil && ctx.Err() == nil {
			m.Log.Warn("updating the selector indexes; retrying", "err", err)
			retry.Reset(time.Second)
		}
	}
}

// flush applies every pending change.
func (m *Maintainer) flush(ctx context.Context) error {
	m.mu.Lock()
	dirty := m.dirty
	m.dirty = map[string]struct{}{}
	m.mu.Unlock()
	for uid := range dirty {
		if err := m.apply(ctx, uid); err != nil {
			m.mu.Lock()
			for u := range dirty {
				m.dirty[u] = struct{}{}
			}
			m.mu.Unlock()
			return err
		}
		delete(dirty, uid)
	}
	return nil
}

// Apply brings one proxy's index memberships in line with the inventory
// now, for a caller that found the store behind.
func (m *Maintainer) Apply(ctx context.Context, uid string) error {
	m.init()
	return m.apply(ctx, uid)
}

// apply brings one proxy's index memberships in line with the inventory.
// Only indexes this broker knows are touched, so one that lags another
// never takes a proxy out of (or puts it in) an index it has not heard of
// yet: the index's builder, which knows it, applies the same change.
func (m *Maintainer) apply(ctx context.Context, uid string) error {
	m.writing.Lock()
	defer m.writing.Unlock()
	p, ok := m.Inv.Get(uid)
	if !ok {
		return m.Store.Forget(ctx, uid)
	}
	var in, out []string
	m.mu.RLock()
	for key, sel := range m.known {
		if sel.Matches(p) {
			in = append(in, key)
		} else {
			out = append(out, key)
		}
	}
	m.mu.RUnlock()
	// Join even with no index: it files the proxy under its exit IP, so
	// a cooldown on that IP counts it before it joins an index.
	if err := m.Store.Join(ctx, "", []store.Member{member(p)}, in); err != nil {
		return err
	}
	if len(out) == 0 {
		return nil
	}
	return m.Store.Leave(ctx, uid, out...)
}

// resync learns the indexes other brokers built, drops idle ones, checks
// each against the inventory, and forgets proxies that are gone.
func (m *Maintainer) resync(ctx context.Context) error {
	touched := map[string]time.Time{}
	m.used.Range(func(k, at any) bool {
		touched[k.(string)] = time.UnixMilli(at.(*atomic.Int64).Load())
		m.used.Delete(k)
		return true
	})
	if err := m.Store.Touch(ctx, touched); err != nil {
		return err
	}
	all, err := m.Store.Indexes(ctx)
	if err != nil {
		return err
	}
	type used struct {
		key string
		at  time.Time
	}
	var mine []used
	for key, ix := range all {
		var sel Selector
		if json.Unmarshal([]byte(ix.Def), &sel) != nil || sel.Scope != m.Scope {
			continue
		}
		if m.Clock.Since(ix.LastUsed) > m.Idle {
			if err := m.drop(ctx, key); err != nil {
				return err
			}
			continue
		}
		m.mu.Lock()
		m.known[key] = sel
		m.mu.Unlock()
		mine = append(mine, used{key, ix.LastUsed})
	}
	sort.Slice(mine, func(i, j int) bool { return mine[i].at.After(mine[j].at) })
	for i, u := range mine {
		if i >= m.MaxIndexes {
			if err := m.drop(ctx, u.key); err != nil {
				return err
			}
			continue
		}
		if err := m.check(ctx, u.key); err != nil {
			return err
		}
	}
	m.mu.Lock()
	for key := range m.known {
		if _, ok := all[key]; !ok {
			delete(m.known, key)
		}
	}
	m.mu.Unlock()
	return m.collect(ctx)
}

func (m *Maintainer) drop(ctx context.Context, key string) error {
	m.Forget(key)
	indexesDropped.Inc()
	return m.Store.Drop(ctx, key)
}

// check repairs one index: members the inventory says belong are added,
// others removed.
func (m *Maintainer) check(ctx context.Context, key string) error {
	m.mu.RLock()
	sel := m.known[key]
	m.mu.RUnlock()
	have, err := m.Store.Members(ctx, key)
	if err != nil {
		return err
	}
	want := map[string]store.Member{}
	for _, mb := range m.members(sel) {
		want[mb.UID] = mb
	}
	for _, uid := range have {
		if _, ok := want[uid]; ok {
			delete(want, uid)
			continue
		}
		indexRepairs.Inc()
		if err := m.Store.Leave(ctx, uid, key); err != nil {
			return err
		}
	}
	var add []store.Member
	var uids []string
	for _, mb := range want {
		add = append(add, mb)
		uids = append(uids, mb.UID)
	}
	// A quarantined proxy is out of its indexes on purpose: the join
	// below only confirms it rejoins at the end, and is no repair.
	states, err := m.Store.States(ctx, "", "", uids)
	if err != nil {
		return err
	}
	for _, st := range states {
		if st.QuarantinedUntil.IsZero() {
			indexRepairs.Inc()
		}
	}
	return m.Store.Join(ctx, "", add, []string{key})
}

// collect forgets proxies of this broker's scope that the store knows and
// the inventory has not had at two resyncs in a row: deleted while no
// broker was watching. Two, because another broker's informer may be a
// moment ahead of this one's.
func (m *Maintainer) collect(ctx context.Context) error {
	known, err := m.Store.Known(ctx)
	if err != nil {
		return err
	}
	missing := map[string]bool{}
	for uid, ns := range known {
		if m.Scope != "" && ns != m.Scope {
			continue
		}
		if _, ok := m.Inv.Get(uid); ok {
			continue
		}
		if m.missing[uid] {
			if err := m.Store.Forget(ctx, uid); err != nil {
				return err
			}
			continue
		}
		missing[uid] = true
	}
	m.missing = missing
	return nil
}
