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
