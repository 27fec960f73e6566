package leases

import (
	"fmt"
	"sync"
	"time"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"k8s.io/utils/clock"
)

// selectorBudget bounds the selectors each tenant brings in: each new
// selector builds an index every lease change then updates, and the
// least recently used index is evicted past --max-indexes, so a tenant
// leasing with a new selector in a loop would slow and evict everyone's.
// A selector counts against the tenant that first leased with it on
// this broker, until it has gone unused for an index's idle time; one
// whose index exists already costs nothing and is not counted.
type selectorBudget struct {
	idle  time.Duration
	clock clock.PassiveClock
	mu    sync.Mutex
	// used is each tenant's selectors (by key) and when each was last
	// leased with.
	used map[string]map[string]time.Time
}

func newSelectorBudget(idle time.Duration, clk clock.PassiveClock) *selectorBudget {
	return &selectorBudget{idle: idle, clock: clk, used: map[string]map[string]time.Time{}}
}

// take counts sel against t, or refuses it when t holds its budget of
// selectors (q) and sel is new; holds says whether sel's index exists.
func (b *selectorBudget) take(t *access.Tenant, sel index.Selector, q access.Limit, holds func(index.Selector) bool) error {
	if q.N <= 0 || t.Name == "" {
		return nil
	}
	key, now := sel.Key(), b.clock.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	mine := b.used[t.Name]
	if _, ok := mine[key]; ok {
		mine[key] = now
		return nil
	}
	if holds(sel) {
		return nil
	}
	if mine == nil {
		mine = map[string]time.Time{}
		b.used[t.Name] = mine
	}
	if len(mine) >= q.N {
		oldest := now
		for k, at := range mine {
			if now.Sub(at) > b.idle {
				delete(mine, k)
			} else if at.Before(oldest) {
				oldest = at
			}
		}
		if len(mine) >= q.N {
			wait := b.idle - now.Sub(oldest)
			return overQuota(t.Name, "selectors", "TENANT_SELECTOR_BUDGET", fmt.Sprintf("tenant %q leases with %d distinct selectors on this broker, its budget (%s): reuse one of them, or wait %s for the oldest to lapse",
				t.Name, len(mine), q.Source, wait.Round(time.Second)), wait)
		}
	}
	mine[key] = now
	return nil
}
