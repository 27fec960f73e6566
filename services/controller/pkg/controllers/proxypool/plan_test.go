package proxypool

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

// pool builds members: "u" an updated healthy member, "o" an outdated
// healthy one, "n" an updated member not yet healthy; names m0, m1, ...
// created a minute apart, so later ones are newer.
func pool(kinds string) []*member {
	var ms []*member
	for i, k := range kinds {
		m := &member{name: fmt.Sprintf("m%d", i), created: t0.Add(time.Duration(i) * time.Minute), ready: true, healthy: true, updated: true}
		switch k {
		case 'o':
			m.updated = false
		case 'n':
			m.healthy, m.ready = false, false
		}
		ms = append(ms, m)
	}
	return ms
}

func TestDecide(t *testing.T) {
	base := limits{replicas: 3, surge: 1, unavailable: 0, budget: 1, markLag: 2 * time.Second, drainTimeout: 10 * time.Minute}
	known := t0 // when the lease counts were read
	for _, tc := range []struct {
		name    string
		l       func(limits) limits
		members func() []*member
		create  int
		drain   []string
		delete  []string
		blocked []string
	}{
		{name: "empty pool is created whole", members: func() []*member { return nil }, create: 3},
		{name: "as desired does nothing", members: func() []*member { return pool("uuu") }},
		{name: "a lost member is replaced", members: func() []*member { return pool("uu") }, create: 1},
		{
			name: "scale-down drains the newest, within the budget",
			l:    func(l limits) limits { l.replicas = 1; return l }, members: func() []*member { return pool("uuu") },
			drain: []string{"m2"},
		},
		{
			name: "members made in the same second go by ordinal, highest first",
			l:    func(l limits) limits { l.replicas = 10; return l },
			members: func() []*member {
				var ms []*member
				for i := range 11 {
					ms = append(ms, &member{name: fmt.Sprintf("p-%d", i), created: t0, ready: true, healthy: true, updated: true})
				}
				return ms
			},
			drain: []string{"p-10"},
		},
		{
			name: "scale-down prefers unleased, then unhealthy, then newest",
			l:    func(l limits) limits { l.replicas = 2; l.budget = 3; return l },
			members: func() []*member {
				ms := pool("uuuun")
				ms[0].leases, ms[3].leases, ms[4].leases = 1, 2, 1
				ms[1].healthy = false
				return ms
			},
			// m1 and m2 hold no lease (m1 unhealthy goes first), then the
			// unhealthy leased m4.
			drain: []string{"m1", "m2", "m4"},
		},
		{
			name:    "a rollout surges one replacement first",
			members: func() []*member { return pool("ooo") }, create: 1,
		},
		{
			name:    "an outdated member waits while its replacement is not healthy",
			members: func() []*member { return pool("ooon") },
		},
		{
			name:    "once the replacement is healthy an outdated member drains and the next replacement comes",
			members: func() []*member { return pool("ooou") }, drain: []string{"m2"}, create: 1,
		},
		{
			name:    "maxSurge 0 with maxUnavailable 1 breaks before it makes",
			l:       func(l limits) limits { l.surge, l.unavailable = 0, 1; return l },
			members: func() []*member { return pool("ooo") }, drain: []string{"m2"}, create: 1,
		},
		{
			name: "an outdated do-not-disrupt member stays, blocks, and gets no replacement",
			members: func() []*member {
				ms := pool("uuo")
				ms[2].doNotDisrupt = true
				return ms
			},
			blocked: []string{"m2"},
		},
		{
			name: "do-not-disrupt is skipped in scale-down",
			l:    func(l limits) limits { l.replicas = 2; return l },
			members: func() []*member {
				ms := pool("uuu")
				ms[2].doNotDisrupt = true
				return ms
			},
			drain: []string{"m1"}, blocked: []string{"m2"},
		},
		{
			name: "draining members use the budget",
			l:    func(l limits) limits { l.replicas = 1; return l },
			members: func() []*member {
				ms := pool("uuu")
				ms[2].deadline, ms[2].leases = t0.Add(5*time.Minute), 1
				return ms
			},
		},
		{
			name: "a drained member with no lease is deleted once the snapshot is newer than the drain",
			members: func() []*member {
				ms := pool("uuuu")
				ms[3].deadline = t0.Add(10*time.Minute - 3*time.Second)
				return ms
			},
			delete: []string{"m3"},
		},
		{
			name: "a snapshot older than the drain's mark lag is not trusted",
			members: func() []*member {
				ms := pool("uuuu")
				ms[3].deadline = t0.Add(10*time.Minute - time.Second)
				return ms
			},
		},
		{
			name: "a drain past its deadline ends, leases or not",
			members: func() []*member {
				ms := pool("uuuu")
				ms[3].deadline, ms[3].leases = t0.Add(-time.Second), 4
				return ms
			},
			delete: []string{"m3"},
		},
		{
			name: "deleting members are gone to the pool",
			members: func() []*member {
				ms := pool("uuu")
				ms[1].deleting = true
				return ms
			},
			create: 1,
		},
		{
			name:    "scale to zero drains everything, the budget allowing",
			l:       func(l limits) limits { l.replicas = 0; l.budget = 5; return l },
			members: func() []*member { return pool("uun") }, drain: []string{"m2", "m1", "m0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := base
			if tc.l != nil {
				l = tc.l(l)
			}
			p := decide(l, tc.members(), known, t0)
			assert.Equal(t, tc.create, len(p.creates), "create")
			assert.Equal(t, tc.drain, p.drain, "drain")
			assert.Equal(t, tc.delete, p.delete, "delete")
			assert.Equal(t, tc.blocked, p.blocked, "blocked")
		})
	}
}

// Without an answer from the broker a drain waits for its deadline.
func TestDecideWithoutLeaseKnowledgeWaitsForTheDeadline(t *testing.T) {
	ms := pool("uuuu")
	ms[3].deadline = t0.Add(time.Minute)
	l := limits{replicas: 3, surge: 1, budget: 1, markLag: time.Second, drainTimeout: 10 * time.Minute}
	assert.Empty(t, decide(l, ms, time.Time{}, t0).delete)
	assert.Equal(t, []string{"m3"}, decide(l, ms, time.Time{}, t0.Add(time.Minute)).delete)
}
