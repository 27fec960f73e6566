package proxypool

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestDecideRemediation(t *testing.T) {
	base := limits{replicas: 3, surge: 1, budget: 3, markLag: time.Second, drainTimeout: time.Minute,
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
