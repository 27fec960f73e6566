package index

import (
	"context"
	"encoding/json"
	"sort"
	"sync/atomic"
	"time"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

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
