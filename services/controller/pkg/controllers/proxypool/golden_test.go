package proxypool

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// updateGolden rewrites testdata/rollout/*.golden from what the planner
// decides now: go test ./pkg/controllers/proxypool -run TestRolloutSequences -update-golden
var updateGolden = flag.Bool("update-golden", false, "rewrite the rollout sequences' golden files")

// world is the planner's world, simulated step by step on a stepped
// clock, as Cluster API's rollout sequence tests simulate a
// MachineDeployment's: each step is one reconcile, its plan applied,
// then the members' events until the next. In order, every event happens
// before the next reconcile (a member created comes up Healthy, a deleted
// one goes); with rng set, each pending event happens or waits a step at
// random, as a busy cluster orders them. Drains hold no leases, and each
// step is later than the mark lag, so a drain ends the step after it
// began.
type world struct {
	l       limits
	now     time.Time
	members []*member
	next    int
	rng     *rand.Rand
	// fail names a member that turns unhealthy once it has come up, at
	// step failAt or later; scaleTo, from step scaleAt, is the new
	// spec.replicas.
	fail             string
	failAt, scaleAt  int
	scaleTo, stepped int
}

// step runs one reconcile and applies its plan; line is the golden
// file's line for it. The events until the next are after.
func (w *world) step() (cmd plan, line string) {
	if w.scaleAt > 0 && w.stepped == w.scaleAt {
		w.l.replicas = w.scaleTo
	}
	cmd = decide(w.l, w.members, w.now, w.now)
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
	line = fmt.Sprintf("%2d r%d drain %v delete %v create %v | %s", w.stepped, w.l.replicas, cmd.drain, cmd.delete, created, w.state())
	return cmd, line
}

// events: the members' changes between two reconciles, and the time
// they take.
func (w *world) events() {
	defer func() {
		w.stepped++
		w.now = w.now.Add(w.l.markLag + time.Second)
	}()
	happens := func() bool { return w.rng == nil || w.rng.IntN(2) == 0 }
	w.members = slices.DeleteFunc(w.members, func(m *member) bool { return m.deleting && happens() })
	for _, m := range w.members {
		switch {
		case m.deleting:
		case m.name == w.fail && m.healthy && w.stepped >= w.failAt:
			m.healthy, m.since, w.fail = false, w.now, ""
		case !m.ready && happens():
			m.ready, m.healthy, m.since = true, true, w.now
		}
	}
}

// state is each member as name:flags: u updated, o outdated; H healthy,
// - not yet up, X up but failing, D draining.
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
		case m.ready:
			f += "X"
		default:
			f += "-"
		}
		out = append(out, m.name+":"+f)
	}
	return strings.Join(out, " ")
}

// converged: replicas active members, all updated and healthy, none
// draining or deleting.
func (w *world) converged() bool {
	n := 0
	for _, m := range w.members {
		if !m.active() || !m.updated || !m.healthy {
			return false
		}
		n++
	}
	return n == w.l.replicas
}

// sequence is one rollout: three members of an old template replaced
// under a surge and unavailability, with or without a member failing
// (remediation) and a scale-down to two on the way.
type sequence struct {
	surge, unavailable int
	remediation        bool
	scaleDown          bool
}

func (s sequence) name() string {
	n := fmt.Sprintf("surge%d-unavailable%d", s.surge, s.unavailable)
	if s.remediation {
		n += "-remediation"
	}
	if s.scaleDown {
		n += "-scaledown"
	}
	return n
}

func (s sequence) world(rng *rand.Rand) *world {
	w := &world{
		l: limits{replicas: 3, surge: s.surge, unavailable: s.unavailable, budget: 3, markLag: 2 * time.Second, drainTimeout: 10 * time.Minute,
			startupTimeout: time.Hour, unhealthyTimeout: 5 * time.Second, maxUnhealthy: 1, maxRetries: 3, backoffBase: time.Second, backoffMax: 10 * time.Second},
		now: t0, next: 3, rng: rng,
	}
	for i := range 3 {
		w.members = append(w.members, &member{name: fmt.Sprintf("m%d", i), created: t0.Add(time.Duration(i-10) * time.Minute), ready: true, healthy: true, since: t0})
	}
	if s.remediation {
		w.fail, w.failAt = "m3", 1 // the first replacement fails once up
	}
	if s.scaleDown {
		w.scaleAt, w.scaleTo = 2, 2
	}
	return w
}

func sequences() []sequence {
	var out []sequence
	for _, su := range [][2]int{{1, 0}, {2, 0}, {0, 1}, {1, 1}, {2, 1}} {
		for _, rem := range []bool{false, true} {
			for _, down := range []bool{false, true} {
				out = append(out, sequence{surge: su[0], unavailable: su[1], remediation: rem, scaleDown: down})
			}
		}
	}
	return out
}

// maxSteps bounds a rollout of three; the random orders take longer.
const maxSteps = 60

// run steps w until it converged and one more reconcile changed nothing,
// checking the rollout's bounds at every step, and returns the lines.
func run(t *testing.T, w *world) []string {
	t.Helper()
	var lines []string
	for range maxSteps {
		healthyBefore, activeBefore := w.healthyActive(), w.active()
		cmd, line := w.step()
		lines = append(lines, line)
		draining := 0
		for _, m := range w.members {
			if m.draining() {
				draining++
			}
		}
		// Never more than maxSurge over replicas, except that a scale-down
		// in the middle of a rollout may leave more while availability
		// holds the outdated members (their replacements are not up):
		// then the surplus only shrinks.
		require.LessOrEqual(t, w.active(), max(w.l.replicas+w.l.surge, activeBefore), "maxSurge broken at\n%s", strings.Join(lines, "\n"))
		require.LessOrEqual(t, draining, w.l.budget, "the disruption budget broken at\n%s", strings.Join(lines, "\n"))
		// A drain never takes healthy members below replicas less
		// maxUnavailable, unless they were already below.
		drainedHealthy := 0
		for _, name := range cmd.drain {
			if m := w.member(name); m != nil && m.healthy {
				drainedHealthy++
			}
		}
		if drainedHealthy > 0 {
			require.GreaterOrEqual(t, healthyBefore-drainedHealthy, w.l.replicas-w.l.unavailable,
				"maxUnavailable broken at\n%s", strings.Join(lines, "\n"))
		}
		if w.converged() && len(cmd.creates)+len(cmd.drain)+len(cmd.delete) == 0 {
			return lines
		}
		w.events()
	}
	require.FailNow(t, "no convergence", "after %d steps:\n%s", maxSteps, strings.Join(lines, "\n"))
	return nil
}

func (w *world) active() int {
	n := 0
	for _, m := range w.members {
		if m.active() {
			n++
		}
	}
	return n
}

func (w *world) healthyActive() int {
	n := 0
	for _, m := range w.members {
		if m.active() && m.healthy {
			n++
		}
	}
	return n
}

func (w *world) member(name string) *member {
	for _, m := range w.members {
		if m.name == name {
			return m
		}
	}
	return nil
}

// Every combination of surge, unavailability, remediation and
// scale-down, step by step against its golden file; then each again with
// the members' events in 50 random orders, which must keep the same
// bounds at every step and end as desired.
func TestRolloutSequences(t *testing.T) {
	for _, s := range sequences() {
		t.Run(s.name(), func(t *testing.T) {
			got := strings.Join(run(t, s.world(nil)), "\n") + "\n"
			path := filepath.Join("testdata", "rollout", s.name()+".golden")
			if *updateGolden {
				require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
			}
			want, err := os.ReadFile(path)
			require.NoError(t, err, "no golden file: run with -update-golden and review it")
			assert.Equal(t, string(want), got, "the sequence changed: review it, and rewrite %s with -update-golden if it is right", path)

			for seed := range uint64(50) {
				t.Run(fmt.Sprintf("random-order-%d", seed), func(t *testing.T) {
					run(t, s.world(rand.New(rand.NewPCG(seed, 49))))
				})
			}
		})
	}
}

// decide changes nothing it is given: the same world decides the same
// plan twice, and every member is as it was.
func TestDecideIsPure(t *testing.T) {
	ms := pool("oouun")
	ms[2].healthy, ms[2].since = false, t0.Add(-time.Hour)
	ms[3].ageLimit = time.Minute
	ms[4].created = t0.Add(-time.Hour)
	before := make([]member, len(ms))
	for i, m := range ms {
		before[i] = *m
	}
	l := limits{replicas: 4, surge: 1, budget: 2, markLag: time.Second, drainTimeout: time.Minute,
		startupTimeout: 10 * time.Minute, unhealthyTimeout: 5 * time.Minute, maxUnhealthy: 3, maxRetries: 2, backoffBase: time.Minute, backoffMax: time.Hour}
	first := decide(l, ms, t0, t0)
	for i, m := range ms {
		assert.Equal(t, before[i], *m, "member %s", m.name)
	}
	assert.Equal(t, first, decide(l, ms, t0, t0))
	assert.NotEmpty(t, first.drain, "the world has causes to act on")
}
