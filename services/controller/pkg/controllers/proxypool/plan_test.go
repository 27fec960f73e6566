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
	base := limits{replicas: 3, surge: 1, unavailable: 0, budget: 1, settle: 2 * time.Second, drainTimeout: 10 * time.Minute}
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
			name: "a snapshot older than the drain's settle time is not trusted",
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
	l := limits{replicas: 3, surge: 1, budget: 1, settle: time.Second, drainTimeout: 10 * time.Minute}
	assert.Empty(t, decide(l, ms, time.Time{}, t0).delete)
	assert.Equal(t, []string{"m3"}, decide(l, ms, time.Time{}, t0.Add(time.Minute)).delete)
}

func TestDecideRemediation(t *testing.T) {
	base := limits{replicas: 3, surge: 1, budget: 3, settle: time.Second, drainTimeout: time.Minute,
		startupTimeout: 10 * time.Minute, unhealthyTimeout: 5 * time.Minute, maxUnhealthy: 1, maxRetries: 2,
		backoffBase: time.Minute, backoffMax: time.Hour}
	known := t0 // when the lease counts were read
	now := t0.Add(time.Hour)
	sick := func(m *member, since time.Duration) { m.healthy, m.since = false, now.Add(-since) }
	for _, tc := range []struct {
		name    string
		l       func(limits) limits
		members func() []*member
		// creates as "replaces/retries"; "" replaces nothing
		creates   []string
		drain     []string
		exhausted int
		paused    bool
		wake      time.Duration
	}{
		{
			name:    "unhealthy past the timeout: drained and replaced at once, the slot's retries counted",
			members: func() []*member { ms := pool("uuu"); sick(ms[1], 6*time.Minute); return ms },
			drain:   []string{"m1"}, creates: []string{"m1/1"},
		},
		{
			name:    "unhealthy within the timeout: wait for it",
			members: func() []*member { ms := pool("uuu"); sick(ms[1], 4*time.Minute); return ms },
			wake:    time.Minute,
		},
		{
			name: "not Ready after startupTimeout: replaced",
			members: func() []*member {
				ms := pool("uun")
				ms[2].created = now.Add(-11 * time.Minute)
				return ms
			},
			drain: []string{"m2"}, creates: []string{"m2/1"},
		},
		{
			name: "more unhealthy than maxUnhealthy: nothing is replaced",
			members: func() []*member {
				ms := pool("uuu")
				sick(ms[0], time.Hour)
				sick(ms[1], time.Hour)
				return ms
			},
			paused: true,
		},
		{
			name: "members unhealthy but not yet due count towards maxUnhealthy once one is due",
			members: func() []*member {
				ms := pool("uuu")
				sick(ms[0], 6*time.Minute)
				sick(ms[1], 4*time.Minute)
				return ms
			},
			paused: true, wake: time.Minute,
		},
		{
			name: "many unhealthy, none due: nothing is paused yet",
			members: func() []*member {
				ms := pool("uuu")
				sick(ms[0], 4*time.Minute)
				sick(ms[1], 4*time.Minute)
				return ms
			},
			wake: time.Minute,
		},
		{
			name: "a slot that used its retries gives up and keeps the member",
			members: func() []*member {
				ms := pool("uuu")
				sick(ms[1], 6*time.Minute)
				ms[1].retries = 2
				return ms
			},
			exhausted: 1,
		},
		{
			name: "the second retry waits its backoff after the failure",
			members: func() []*member {
				ms := pool("uuu")
				sick(ms[1], 5*time.Minute+30*time.Second) // failed 30 s ago
				ms[1].retries = 1                         // backoff 1 min
				return ms
			},
			wake: 30 * time.Second,
		},
		{
			name: "a member already replaced is not replaced twice",
			members: func() []*member {
				ms := pool("uuun")
				ms[1].ageLimit = time.Minute // past maxAge, still serving
				ms[3].created, ms[3].replaces = now.Add(-time.Minute), "m1"
				return ms
			},
			wake: 9 * time.Minute, // the replacement's startup deadline
		},
		{
			name: "past maxAge: a replacement first, the member drains once it is healthy",
			members: func() []*member {
				ms := pool("uuu")
				ms[0].ageLimit = 30 * time.Minute
				return ms
			},
			creates: []string{"m0/0"},
		},
		{
			name: "maxAge not reached: look again when it is",
			members: func() []*member {
				ms := pool("uuu")
				ms[2].created = now.Add(-50 * time.Minute)
				ms[2].ageLimit = time.Hour
				return ms
			},
			wake: 10 * time.Minute,
		},
		{
			name: "rolloutAfter passed: members made before it are replaced, make-before-break, one surge at a time",
			l:    func(l limits) limits { l.rolloutAfter = now.Add(-time.Second); return l },
			members: func() []*member {
				ms := pool("uuu")
				ms[2].created = now.Add(-time.Second) // made in the same second: stays
				return ms
			},
			creates: []string{"m1/0"},
		},
		{
			name:    "rolloutAfter ahead: nothing yet, look again when it comes",
			l:       func(l limits) limits { l.rolloutAfter = now.Add(3 * time.Minute); return l },
			members: func() []*member { return pool("uuu") },
			wake:    3 * time.Minute,
		},
		{
			name:    "rolloutAfter passed and every member made since: as desired",
			l:       func(l limits) limits { l.rolloutAfter = t0.Add(-time.Hour); return l },
			members: func() []*member { return pool("uuu") },
		},
		{
			name: "two members with one egress IP: the newer is replaced",
			l:    func(l limits) limits { l.distinctEgressIPs = true; return l },
			members: func() []*member {
				ms := pool("uuu")
				ms[0].egressIP, ms[2].egressIP, ms[1].egressIP = "198.51.100.7", "198.51.100.7", "198.51.100.8"
				return ms
			},
			creates: []string{"m2/1"},
		},
		{
			name: "without distinctEgressIPs a shared egress IP is fine",
			members: func() []*member {
				ms := pool("uuu")
				ms[0].egressIP, ms[2].egressIP = "198.51.100.7", "198.51.100.7"
				return ms
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := base
			if tc.l != nil {
				l = tc.l(l)
			}
			p := decide(l, tc.members(), known, now)
			var creates []string
			for _, c := range p.creates {
				creates = append(creates, fmt.Sprintf("%s/%d", c.replaces, c.retries))
			}
			assert.Equal(t, tc.creates, creates, "creates")
			assert.Equal(t, tc.drain, p.drain, "drain")
			assert.Len(t, p.exhausted, tc.exhausted, "exhausted: %v", p.exhausted)
			assert.Equal(t, tc.paused, p.paused != "", "paused: %q", p.paused)
			assert.Equal(t, tc.wake, p.wake, "wake")
		})
	}
}
