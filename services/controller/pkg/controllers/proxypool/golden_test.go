package proxypool

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// world is the planner's world, simulated: members come up Healthy
// before the reconcile after their creation, a drain's leases end at once, and each step
// is later than a drain's settle time, so a drain ends the step after it
// began. Deletes take effect at once.
type world struct {
	l       limits
	now     time.Time
	members []*member
	next    int
}

func (w *world) step() (Command, string) {
	cmd := decide(w.l, w.members, w.now, w.now)
	var created []string
	for _, c := range cmd.creates {
		m := &member{name: fmt.Sprintf("m%d", w.next), created: w.now, updated: true, replaces: c.replaces, retries: c.retries}
		w.next++
		w.members = append(w.members, m)
		created = append(created, m.name)
	}
	deadline := w.now.Add(w.l.drainTimeout)
	for _, m := range w.members {
		switch {
		case slices.Contains(cmd.delete, m.name):
			m.deleting = true
		case slices.Contains(cmd.drain, m.name):
			m.deadline = deadline
		}
	}
	line := fmt.Sprintf("drain %v delete %v create %v | %s", cmd.drain, cmd.delete, created, w.state())
	// Between reconciles: the new come up, the deleted go.
	w.members = slices.DeleteFunc(w.members, func(m *member) bool { return m.deleting })
	for _, m := range w.members {
		if !m.ready {
			m.ready, m.healthy, m.since = true, true, w.now
		}
	}
	w.now = w.now.Add(w.l.settle + time.Second)
	return cmd, line
}

// state is each member as name:flags, u updated, o outdated, H healthy,
// - not yet, D draining.
func (w *world) state() string {
	var out []string
	for _, m := range w.members {
		if m.deleting {
			continue
		}
		f := "o"
		if m.updated {
			f = "u"
		}
		switch {
		case m.draining():
			f += "D"
		case m.healthy:
			f += "H"
		default:
			f += "-"
		}
		out = append(out, m.name+":"+f)
	}
	return strings.Join(out, " ")
}

// A rollout of three members under maxSurge 1 and maxUnavailable 0, step
// by step, as Cluster API tests MachineSet: each reconcile's Command and
// the world it leaves. Every step keeps all three replicas healthy and at
// most one member over, and the rollout ends as desired.
func TestRolloutGoldenSequence(t *testing.T) {
	for _, tc := range []struct {
		name               string
		surge, unavailable int
		golden             []string
	}{
		{
			name: "maxSurge 1, maxUnavailable 0: make before break", surge: 1, unavailable: 0,
			golden: []string{
				"drain [] delete [] create [m3] | m0:oH m1:oH m2:oH m3:u-",
				"drain [m2] delete [] create [m4] | m0:oH m1:oH m2:oD m3:uH m4:u-",
				"drain [m1] delete [m2] create [m5] | m0:oH m1:oD m3:uH m4:uH m5:u-",
				"drain [m0] delete [m1] create [] | m0:oD m3:uH m4:uH m5:uH",
				"drain [] delete [m0] create [] | m3:uH m4:uH m5:uH",
				"drain [] delete [] create [] | m3:uH m4:uH m5:uH",
			},
		},
		{
			name: "maxSurge 0, maxUnavailable 1: break before make", surge: 0, unavailable: 1,
			golden: []string{
				"drain [m2] delete [] create [m3] | m0:oH m1:oH m2:oD m3:u-",
				"drain [m1] delete [m2] create [m4] | m0:oH m1:oD m3:uH m4:u-",
				"drain [m0] delete [m1] create [m5] | m0:oD m3:uH m4:uH m5:u-",
				"drain [] delete [m0] create [] | m3:uH m4:uH m5:uH",
				"drain [] delete [] create [] | m3:uH m4:uH m5:uH",
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &world{l: limits{replicas: 3, surge: tc.surge, unavailable: tc.unavailable, budget: 3, settle: 2 * time.Second, drainTimeout: 10 * time.Minute}, now: t0, next: 3}
			for i := range 3 {
				w.members = append(w.members, &member{name: fmt.Sprintf("m%d", i), created: t0.Add(time.Duration(i-10) * time.Minute), ready: true, healthy: true, since: t0})
			}
			var got []string
			for range len(tc.golden) {
				cmd, line := w.step()
				got = append(got, line)
				active, healthy := 0, 0
				for _, m := range w.members {
					if m.active() {
						active++
						if m.healthy {
							healthy++
						}
					}
				}
				assert.LessOrEqual(t, active, w.l.replicas+w.l.surge, "maxSurge: %s", line)
				assert.GreaterOrEqual(t, healthy+len(cmd.creates), w.l.replicas-w.l.unavailable, "maxUnavailable: %s", line)
			}
			require.Equal(t, tc.golden, got)
		})
	}
}

// decide changes nothing it is given: the same world decides the same
// Command twice, and every member is as it was.
func TestDecideIsPure(t *testing.T) {
	ms := pool("oouun")
	ms[2].healthy, ms[2].since = false, t0.Add(-time.Hour)
	ms[3].ageLimit = time.Minute
	ms[4].created = t0.Add(-time.Hour)
	before := make([]member, len(ms))
	for i, m := range ms {
		before[i] = *m
	}
	l := limits{replicas: 4, surge: 1, budget: 2, settle: time.Second, drainTimeout: time.Minute,
		startupTimeout: 10 * time.Minute, unhealthyTimeout: 5 * time.Minute, maxUnhealthy: 3, maxRetries: 2, backoffBase: time.Minute, backoffMax: time.Hour}
	first := decide(l, ms, t0, t0)
	for i, m := range ms {
		assert.Equal(t, before[i], *m, "member %s", m.name)
	}
	assert.Equal(t, first, decide(l, ms, t0, t0))
	assert.NotEmpty(t, first.drain, "the world has causes to act on")
}
