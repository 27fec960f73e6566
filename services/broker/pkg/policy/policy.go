// Package policy resolves a target site to how the broker treats its
// leases and reports: the most specific TargetPolicy that matches it,
// field by field over the broker's flags.
package policy

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/client-go/tools/cache"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Target is the policy of one target.
type Target struct {
	store.Policy
	// MaxConcurrentLeases caps the target's live leases fleet-wide; 0: none.
	MaxConcurrentLeases int
	// Source is the TargetPolicy's namespace/name, "" for the flags.
	Source string
}

// Policies resolves targets. Its zero value resolves every target to
// Defaults; Watch keeps it current from the TargetPolicies in a cache.
type Policies struct {
	Defaults Target
	Log      *slog.Logger

	// byPattern maps "example.com" and "*.example.com" to the policy
	// that wins the pattern; replaced whole on every change.
	byPattern atomic.Pointer[map[string]Target]
	synced    atomic.Bool
	mu        sync.Mutex
}

// For returns target's policy: an exact pattern first, then the
// wildcards from the longest suffix to the shortest ("*.a.example.com",
// "*.example.com", "*.com"), else the defaults.
func (p *Policies) For(target string) Target {
	m := p.byPattern.Load()
	if m == nil || target == "" {
		return p.Defaults
	}
	if t, ok := (*m)[target]; ok {
		return t
	}
	for rest := target; ; {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			return p.Defaults
		}
		rest = rest[i+1:]
		if t, ok := (*m)["*."+rest]; ok {
			return t
		}
	}
}

// Synced reports whether the first list of TargetPolicies has arrived
// (always true without Watch).
func (p *Policies) Synced() bool { return p.byPattern.Load() == nil || p.synced.Load() }

// Watch keeps p current from c's TargetPolicies until ctx ends.
func (p *Policies) Watch(ctx context.Context, c crcache.Cache) error {
	empty := map[string]Target{}
	p.byPattern.Store(&empty)
	inf, err := c.GetInformer(ctx, &v1.TargetPolicy{})
	if err != nil {
		return fmt.Errorf("getting the TargetPolicy informer: %w", err)
	}
	reload := func() {
		var list v1.TargetPolicyList
		if err := c.List(ctx, &list); err != nil {
			p.Log.Warn("listing TargetPolicies", "err", err)
			return
		}
		p.Set(list.Items)
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { reload() },
		UpdateFunc: func(any, any) { reload() },
		DeleteFunc: func(any) { reload() },
	}); err != nil {
		return err
	}
	go func() {
		if c.WaitForCacheSync(ctx) {
			reload()
			p.synced.Store(true)
		}
	}()
	return nil
}

// Set replaces the policies with items. Where two claim one pattern, the
// oldest (then the first by namespace/name) wins, and the loser is logged.
func (p *Policies) Set(items []v1.TargetPolicy) {
	p.mu.Lock()
	defer p.mu.Unlock()
	sort.Slice(items, func(i, j int) bool {
		a, b := items[i], items[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Key() < b.Key()
	})
	m := map[string]Target{}
	for i := range items {
		t := p.merge(&items[i])
		for _, pat := range items[i].Spec.Targets {
			if was, ok := m[pat]; ok {
				if p.Log != nil {
					p.Log.Warn("two TargetPolicies claim one target; the older applies", "target", pat, "applies", was.Source, "ignored", t.Source)
				}
				continue
			}
			m[pat] = t
		}
	}
	p.byPattern.Store(&m)
}

// merge lays tp's fields over the defaults, then keeps the pace's bounds
// in order: a policy may set one bound alone, beyond a flag's other.
func (p *Policies) merge(tp *v1.TargetPolicy) Target {
	t := p.Defaults
	t.Source = tp.Key()
	s := tp.Spec
	if c := s.Cooldown; c != nil {
		if c.Base != nil {
			t.CooldownBase = c.Base.Duration
		}
		if c.Max != nil {
			t.CooldownMax = c.Max.Duration
		}
		if c.Window != nil {
			t.CooldownWindow = c.Window.Duration
		}
	}
	t.CooldownMax = max(t.CooldownMax, t.CooldownBase)
	if s.MaxCoolingFraction != nil {
		t.MaxCoolingFraction = *s.MaxCoolingFraction
	}
	if s.MaxConcurrentLeases != nil {
		t.MaxConcurrentLeases = int(*s.MaxConcurrentLeases)
	}
	if pc := s.Pacing; pc != nil {
		if pc.Initial != nil {
			t.PacingInitial = *pc.Initial
		}
		if pc.Min != nil {
			t.PacingMin = *pc.Min
		}
		if pc.Max != nil {
			t.PacingMax = *pc.Max
		}
	}
	t.PacingMin = min(t.PacingMin, t.PacingMax)
	t.PacingInitial = min(max(t.PacingInitial, t.PacingMin), t.PacingMax)
	return t
}
