package agent

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

func target(id string, port int, every time.Duration) *probev1.ProbeTarget {
	return &probev1.ProbeTarget{Id: id, Uid: id, Address: "127.0.0.1", Port: int32(port), Settings: &probev1.ProbeSettings{
		Url: "https://127.0.0.1:1/", ExpectedStatus: 204, Interval: durationpb.New(every), Timeout: durationpb.New(time.Second)}}
}

// Each target is probed on its own interval; full and delta assignments
// add, change and remove exactly what they say. The "proxies" are closed
// loopback ports, so every probe fails fast at dial: the scheduler, not
// the network, is under test.
func TestSchedulerFollowsAssignments(t *testing.T) {
	closed := proc.FreePort(t)
	s := newScheduler(4)
	out := make(chan *probev1.ProbeResult, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); s.run(ctx, &probe.Prober{}, out) }()
	defer func() { cancel(); wg.Wait() }()

	count := func(d time.Duration) map[string]int {
		got := map[string]int{}
		deadline := time.After(d)
		for {
			select {
			case r := <-out:
				require.Equal(t, probev1.ProbePhase_PROBE_PHASE_DIAL, r.GetPhase())
				got[r.GetId()]++
			case <-deadline:
				return got
			}
		}
	}

	s.apply(&probev1.Assignment{Full: true, Upsert: []*probev1.ProbeTarget{target("fast", closed, 100*time.Millisecond), target("slow", closed, time.Hour)}})
	got := count(time.Second)
	assert.InDelta(t, 10, got["fast"], 3, "probed every 100ms")
	assert.LessOrEqual(t, got["slow"], 1, "an hourly target is probed at most once in a second")

	s.apply(&probev1.Assignment{Upsert: []*probev1.ProbeTarget{target("new", closed, 100*time.Millisecond)}, Remove: []string{"fast"}})
	count(200 * time.Millisecond) // drain probes already in flight
	got = count(time.Second)
	assert.Zero(t, got["fast"], "removed")
	assert.InDelta(t, 10, got["new"], 3, "added by a delta")
	assert.Equal(t, 2, s.size())

	s.apply(&probev1.Assignment{Full: true})
	assert.Zero(t, s.size(), "an empty full assignment clears everything")
}

// A proxy that never answers, probed every 50ms with a 2s timeout, holds
// one probe slot, not one per interval: the other proxy of a prober with
// four slots is still probed on time.
func TestASilentProxyHoldsOneSlot(t *testing.T) {
	closed := proc.FreePort(t)
	silent := proc.SilentListener(t)
	_, port, _ := strings.Cut(silent, ":")
	slow := target("silent", 0, 50*time.Millisecond)
	slow.Port = int32(mustAtoi(t, port))
	slow.Settings.Timeout = durationpb.New(2 * time.Second)
	s := newScheduler(4)
	out := make(chan *probev1.ProbeResult, 1024)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { s.run(ctx, &probe.Prober{}, out) })
	defer func() { cancel(); wg.Wait() }()
	skipped0 := testutil.ToFloat64(skipped)

	s.apply(&probev1.Assignment{Full: true, Upsert: []*probev1.ProbeTarget{slow, target("fast", closed, 100*time.Millisecond)}})
	got := map[string]int{}
	deadline := time.After(time.Second)
	maxInflight := 0.0
	for done := false; !done; {
		select {
		case r := <-out:
			got[r.GetId()]++
		case <-time.After(10 * time.Millisecond):
			maxInflight = max(maxInflight, testutil.ToFloat64(inflight))
		case <-deadline:
			done = true
		}
	}
	assert.Zero(t, got["silent"], "its one probe is still waiting out its timeout")
	// Counts, not timings: four probes of the silent proxy would have
	// held every slot within 200ms, and the other proxy would have none.
	assert.GreaterOrEqual(t, got["fast"], 4, "the other proxy is still probed")
	assert.LessOrEqual(t, maxInflight, 2.0, "the silent proxy holds one slot")
	assert.GreaterOrEqual(t, testutil.ToFloat64(skipped)-skipped0, 4.0, "its later probes were skipped, and counted")
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}
