package health

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

var seq int

func readyProxy(t *testing.T, name, ip string) *v1.Proxy {
	t.Helper()
	seq++
	return env.ReadyProxy(t, "default", fmt.Sprintf("%s-%d", name, seq), ip, 3128, nil, false)
}

func result(px *v1.Proxy, ok bool) *probev1.ProbeResult {
	r := &probev1.ProbeResult{Id: px.Key(), Uid: string(px.UID), Success: ok,
		Latency: durationpb.New(3 * time.Millisecond), FinishedAt: timestamppb.Now()}
	if !ok {
		r.Phase, r.Reason = probev1.ProbePhase_PROBE_PHASE_CONNECT, "proxy refused CONNECT 127.0.0.1:443: 403 Forbidden"
	}
	return r
}

func get(t *testing.T, px *v1.Proxy) *v1.Proxy {
	out := &v1.Proxy{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKeyFromObject(px), out))
	return out
}

// startEngine runs an engine's writers against the API server until the
// test ends.
func startEngine(t *testing.T, rec ...*events.FakeRecorder) *Engine {
	t.Helper()
	var recorder events.EventRecorder
	if len(rec) > 0 {
		recorder = rec[0]
	}
	e := NewEngine(env.Client, recorder, nil, slog.Default(), EngineOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// handle feeds results in and waits until every write they caused is made.
func handle(t *testing.T, e *Engine, rs ...*probev1.ProbeResult) {
	t.Helper()
	for _, r := range rs {
		e.Handle(context.Background(), "p1", r)
	}
	require.Eventually(t, e.Idle, 10*time.Second, 5*time.Millisecond, "the health writes never drained")
}

func track(e *Engine, px *v1.Proxy, addr string, r Settings) {
	e.Track(px, addr, r)
}

// writes counts the engine's status writes so far, in every test.
func writes() float64 { return testutil.ToFloat64(metrics.StatusWrites.WithLabelValues("health")) }

func healthCond(px *v1.Proxy) *metav1.Condition {
	return meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy)
}

func TestThresholdsAreExactAndWritesTransitionOnly(t *testing.T) {
	testenv.Require(t)
	px := readyProxy(t, "thresholds", "127.0.0.5")
	rec := events.NewFakeRecorder(16)
	e := startEngine(t, rec)
	track(e, px, "127.0.0.5:3128", DefaultDefaults.Resolve(&v1.HealthCheck{FailureThreshold: 3, SuccessThreshold: 2}))

	w0 := writes()
	handle(t, e, result(px, true))
	assert.Equal(t, metav1.ConditionUnknown, healthCond(get(t, px)).Status, "one success is below the threshold of 2")
	handle(t, e, result(px, true))
	got := get(t, px)
	assert.Equal(t, metav1.ConditionTrue, healthCond(got).Status, "the second success crosses it")
	assert.True(t, got.Status.Healthy)
	require.NotNil(t, got.Status.LastHealthCheckTime)
	assert.Equal(t, w0+1, writes())
	assert.Empty(t, rec.Events, "a new proxy passing its first probes is no news: its condition says so")

	for range 50 {
		handle(t, e, result(px, true))
	}
	assert.Equal(t, w0+1, writes(), "50 more successes of a steady proxy write nothing")
	assert.Equal(t, got.ResourceVersion, get(t, px).ResourceVersion)

	handle(t, e, result(px, false))
	handle(t, e, result(px, false))
	assert.True(t, get(t, px).Status.Healthy, "two failures are below the threshold of 3")
	handle(t, e, result(px, true)) // a success resets the run
	handle(t, e, result(px, false))
	handle(t, e, result(px, false))
	assert.True(t, get(t, px).Status.Healthy, "the run of failures restarted")
	handle(t, e, result(px, false))
	down := get(t, px)
	assert.False(t, down.Status.Healthy, "the third consecutive failure crosses it")
	c := healthCond(down)
	assert.Equal(t, v1.ReasonProbeFailed, c.Reason)
	assert.Contains(t, c.Message, "connect failed: proxy refused CONNECT")
	assert.Equal(t, w0+2, writes())
	assert.Contains(t, <-rec.Events, "Warning ProbeFailed connect failed: proxy refused CONNECT")
	for range 20 {
		handle(t, e, result(px, false))
	}
	assert.Equal(t, w0+2, writes(), "a steadily dead proxy writes nothing more")
	assert.Empty(t, rec.Events, "an Event per transition, not per probe")
	handle(t, e, result(px, true))
	handle(t, e, result(px, true))
	assert.True(t, get(t, px).Status.Healthy, "two successes bring it back")
	assert.Contains(t, <-rec.Events, "Normal ProbeSucceeded", "a recovery is news")
}

func TestStaleResultsAreDroppedAndEgressIPRecorded(t *testing.T) {
	testenv.Require(t)
	px := readyProxy(t, "stale", "127.0.0.6")
	e := startEngine(t)
	r := DefaultDefaults.Resolve(&v1.HealthCheck{SuccessThreshold: 1})
	ctx := context.Background()

	handle(t, e, result(px, true))
	assert.Equal(t, metav1.ConditionUnknown, healthCond(get(t, px)).Status, "results for an untracked proxy are dropped")

	track(e, px, "127.0.0.6:3128", r)
	ok := result(px, true)
	ok.EgressIp = "198.51.100.23"
	handle(t, e, ok)
	got := get(t, px)
	assert.True(t, got.Status.Healthy)
	assert.Equal(t, "198.51.100.23", got.Status.EgressIP, "the echoed exit IP lands in status")
	assert.Equal(t, "127.0.0.6", got.Status.IP, "distinct from the proxy's own IP")

	// The instance is replaced (new IP): a late result about the old one
	// must not touch the new one's status.
	got.Status.IP = "127.0.0.7"
	meta.SetStatusCondition(&got.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: v1.ReasonNotProbed, Message: "replacement"})
	require.NoError(t, env.Client.Status().Update(ctx, got))
	late := result(px, false)
	track(e, px, "127.0.0.6:3128", DefaultDefaults.Resolve(&v1.HealthCheck{FailureThreshold: 1}))
	handle(t, e, late)
	assert.Equal(t, metav1.ConditionUnknown, healthCond(get(t, px)).Status)
}

// The echoed egress IP rides along with the first verdict rather than
// costing a write of its own; once the proxy is Healthy, a new egress IP
// (the cloud gave the VM another address) is written when it appears.
func TestEgressIPRidesWithTheVerdict(t *testing.T) {
	testenv.Require(t)
	px := readyProxy(t, "egress", "127.0.0.8")
	e := startEngine(t)
	track(e, px, "127.0.0.8:3128", DefaultDefaults.Resolve(&v1.HealthCheck{SuccessThreshold: 2}))
	w0 := writes()
	ok := func(ip string) *probev1.ProbeResult { r := result(px, true); r.EgressIp = ip; return r }

	handle(t, e, ok("198.51.100.1"))
	assert.Equal(t, w0, writes(), "an undecided proxy's egress IP waits for its verdict")
	assert.Empty(t, get(t, px).Status.EgressIP)
	handle(t, e, ok("198.51.100.1"))
	got := get(t, px)
	assert.Equal(t, w0+1, writes(), "verdict and egress IP in one write")
	assert.True(t, got.Status.Healthy)
	assert.Equal(t, "198.51.100.1", got.Status.EgressIP)

	handle(t, e, ok("198.51.100.2"))
	assert.Equal(t, w0+2, writes())
	assert.Equal(t, "198.51.100.2", get(t, px).Status.EgressIP, "a Healthy proxy's new egress IP is written")
	handle(t, e, ok("198.51.100.2"))
	assert.Equal(t, w0+2, writes(), "and only once")
}

// A proxy that stops getting results goes stale in one write, stops being
// Healthy, says so in an Event and a metric, and its next result decides it
// again at once. A replica that does not lead neither sweeps nor writes.
func TestNoResultsMakeHealthStaleOnceAndAResultRestoresIt(t *testing.T) {
	testenv.Require(t)
	px := readyProxy(t, "silent", "127.0.0.9")
	rec := events.NewFakeRecorder(16)
	elected := make(chan struct{})
	clk := clocktesting.NewFakeClock(time.Now())
	e := NewEngine(env.Client, rec, elected, slog.Default(), EngineOptions{Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	const interval = 300 * time.Millisecond
	s := DefaultDefaults.Resolve(&v1.HealthCheck{SuccessThreshold: 1})
	s.Interval = interval
	e.Track(px, "127.0.0.9:3128", s)
	w0 := writes()

	e.Handle(ctx, "p1", result(px, true))
	clk.Step(2 * DefaultStaleIntervals * interval)
	assert.False(t, clk.HasWaiters(), "a follower does not sweep: it has no ticker")
	assert.Equal(t, w0, writes(), "a follower writes nothing")
	assert.Equal(t, 0.0, testutil.ToFloat64(staleProxies))

	// Elected, it writes what it decided before it led (Healthy), then,
	// with no result since the election, stale once 3 intervals pass on
	// its clock: two writes, counted below.
	close(elected)
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond, "elected, the engine sweeps")
	require.Eventually(t, func() bool { return healthCond(get(t, px)).Status == metav1.ConditionTrue }, 10*time.Second, 10*time.Millisecond)
	clk.Step(DefaultStaleIntervals*interval + sweepEvery)
	require.Eventually(t, func() bool { return healthCond(get(t, px)).Reason == v1.ReasonProbeStale }, 10*time.Second, 10*time.Millisecond)
	got := get(t, px)
	c := healthCond(got)
	assert.Equal(t, metav1.ConditionUnknown, c.Status)
	assert.False(t, got.Status.Healthy, "a stale proxy is not leasable")
	assert.Contains(t, c.Message, "no probe result for")
	assert.Contains(t, c.Message, "3 intervals of 300ms")
	assert.Equal(t, 1.0, testutil.ToFloat64(staleProxies))
	assert.Contains(t, <-rec.Events, "Warning ProbeStale no probe result for", "the pre-election verdict, a first success, was no Event")
	require.Eventually(t, e.Idle, 5*time.Second, 5*time.Millisecond)
	for range 5 {
		clk.Step(sweepEvery)
		e.sweep(clk.Now()) // as the ticker does, but done when it returns
	}
	require.Eventually(t, e.Idle, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, w0+2, writes(), "the pre-election verdict, then staleness as one transition, not a write per sweep")
	assert.Equal(t, got.ResourceVersion, get(t, px).ResourceVersion)

	// One result, even below the success threshold, decides it again.
	strict := s
	strict.SuccessThreshold = 3
	e.Track(got, "127.0.0.9:3128", strict)
	handle(t, e, result(px, true))
	back := get(t, px)
	assert.True(t, back.Status.Healthy)
	assert.Equal(t, v1.ReasonProbeSucceeded, healthCond(back).Reason)
	assert.Equal(t, 0.0, testutil.ToFloat64(staleProxies))
	assert.Contains(t, <-rec.Events, "Normal ProbeResumed")
}

// A reason of 5 MiB from a prober (the API server caps a Condition message
// at 32 KiB) still makes the proxy Unhealthy, with the reason cut to fit.
func TestAHugeReasonStillMakesTheProxyUnhealthy(t *testing.T) {
	testenv.Require(t)
	px := readyProxy(t, "huge-reason", "127.0.0.10")
	e := startEngine(t)
	track(e, px, "127.0.0.10:3128", DefaultDefaults.Resolve(&v1.HealthCheck{FailureThreshold: 1}))
	r := result(px, false)
	r.Reason = strings.Repeat("\x1b[31mA", 1<<20)
	handle(t, e, r)
	got := get(t, px)
	assert.False(t, got.Status.Healthy)
	c := healthCond(got)
	require.Equal(t, metav1.ConditionFalse, c.Status)
	assert.LessOrEqual(t, len(c.Message), sanitize.MaxReason+64)
	assert.NotContains(t, c.Message, "\x1b")
	assert.True(t, strings.HasSuffix(c.Message, "…"))
}

// A proxy the brokers quarantined gets its next success written, once, so
// the brokers, which see probes only through status, end the quarantine;
// a steady proxy nobody quarantined still writes nothing.
func TestAQuarantinedProxysNextSuccessIsWritten(t *testing.T) {
	testenv.Require(t)
	px := readyProxy(t, "quarantined", "127.0.0.9")
	e := startEngine(t)
	track(e, px, "127.0.0.9:3128", DefaultDefaults.Resolve(&v1.HealthCheck{SuccessThreshold: 1}))
	at := func(r *probev1.ProbeResult, t time.Time) *probev1.ProbeResult {
		r.FinishedAt = timestamppb.New(t)
		return r
	}
	since := time.Now().Add(-time.Minute).Truncate(time.Second).Add(300 * time.Millisecond)
	handle(t, e, at(result(px, true), since.Add(-10*time.Second)))
	w0 := writes()

	e.Confirm(map[string]time.Time{px.Key(): since})
	handle(t, e, at(result(px, true), since.Add(500*time.Millisecond)))
	assert.Equal(t, w0, writes(), "a success in the quarantine's own second may have preceded it")
	handle(t, e, at(result(px, false), since.Add(2*time.Second))) // one failure, below the threshold
	confirmedAt := since.Add(3 * time.Second)
	handle(t, e, at(result(px, true), confirmedAt))
	assert.Equal(t, w0+1, writes())
	got := get(t, px)
	require.NotNil(t, got.Status.LastHealthCheckTime)
	assert.Equal(t, confirmedAt.Truncate(time.Second).Unix(), got.Status.LastHealthCheckTime.Unix())
	assert.True(t, got.Status.Healthy)

	handle(t, e, at(result(px, true), since.Add(5*time.Second)))
	e.Confirm(map[string]time.Time{px.Key(): since}) // the brokers have not caught up yet
	handle(t, e, at(result(px, true), since.Add(7*time.Second)))
	assert.Equal(t, w0+1, writes(), "one write per quarantine")

	e.Confirm(map[string]time.Time{})
	handle(t, e, at(result(px, true), since.Add(9*time.Second)))
	assert.Equal(t, w0+1, writes(), "nothing for a proxy nobody quarantined")
}

// The engine alone owns the health fields, so it starts them over when the
// lifecycle says a new instance exists (the generation moved), and stamps
// health written before the stamp existed instead of discarding it.
func TestANewInstanceGenerationStartsHealthOver(t *testing.T) {
	testenv.Require(t)
	e := startEngine(t)
	s := DefaultDefaults.Resolve(&v1.HealthCheck{SuccessThreshold: 1})
	for _, tc := range []struct {
		name        string
		healthGen   int64
		wantHealthy bool
		wantReason  string
		wantEgress  string
	}{
		{"health of the previous instance is reset", 1, false, v1.ReasonNotProbed, ""},
		{"health from before the stamp is this instance's", 0, true, v1.ReasonProbeSucceeded, "198.51.100.9"},
		{"health from before the stamp, older than Ready, is an earlier instance's", -1, false, v1.ReasonNotProbed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := readyProxy(t, "gen", "127.0.0.9")
			// -1: written before the stamp, an hour before the instance's
			// Ready.
			verdictAt := metav1.Now()
			if tc.healthGen < 0 {
				tc.healthGen, verdictAt = 0, metav1.NewTime(time.Now().Add(-time.Hour))
			}
			px.Status.InstanceGeneration, px.Status.HealthInstanceGeneration, px.Status.EgressIP, px.Status.Healthy = 2, tc.healthGen, "198.51.100.9", true
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded, Message: "an earlier probe", LastTransitionTime: verdictAt})
			require.NoError(t, env.Client.Status().Update(context.Background(), px))
			require.Equal(t, tc.wantHealthy, px.Status.IsHealthy(), "what the brokers read before the engine writes")

			e.Track(px, "127.0.0.9:3128", s)
			require.Eventually(t, func() bool { return get(t, px).Status.HealthInstanceGeneration == 2 }, 10*time.Second, 5*time.Millisecond)
			got := get(t, px)
			assert.Equal(t, tc.wantHealthy, got.Status.IsHealthy())
			assert.Equal(t, tc.wantReason, healthCond(got).Reason)
			assert.Equal(t, tc.wantEgress, got.Status.EgressIP)
			if !tc.wantHealthy {
				assert.Nil(t, got.Status.LastHealthCheckTime)
				assert.Equal(t, "instance 2 not probed yet", healthCond(got).Message)
				handle(t, e, result(got, true))
				assert.True(t, get(t, px).Status.IsHealthy(), "the new instance's own success decides it")
			}
		})
	}
}

// A metered ProxySource's meter: the bytes of each tracked proxy's
// results, and their count, summed over the proxies asked about;
// results for an untracked proxy, and a forgotten proxy's, count nothing.
func TestProbeBytesSumWhatProbesSpent(t *testing.T) {
	testenv.Require(t)
	a, b := readyProxy(t, "metered", "127.0.0.8"), readyProxy(t, "metered", "127.0.0.9")
	e := startEngine(t)
	r := DefaultDefaults.Resolve(nil)
	spend := func(px *v1.Proxy, n int64) *probev1.ProbeResult {
		res := result(px, true)
		res.Bytes = n
		return res
	}
	handle(t, e, spend(a, 999))
	track(e, a, "127.0.0.8:3128", r)
	track(e, b, "127.0.0.9:3128", r)
	handle(t, e, spend(a, 4000), spend(a, 5000), spend(b, 7000), spend(b, 0))
	keys := []types.NamespacedName{client.ObjectKeyFromObject(a), client.ObjectKeyFromObject(b)}
	bytes, probes := e.ProbeBytes(keys)
	assert.Equal(t, int64(16000), bytes)
	assert.Equal(t, int64(3), probes, "a result that counted no byte is not a metered probe")
	bytes, _ = e.ProbeBytes(keys[:1])
	assert.Equal(t, int64(9000), bytes)
	e.Forget(a.UID)
	bytes, probes = e.ProbeBytes(keys)
	assert.Equal(t, int64(7000), bytes)
	assert.Equal(t, int64(1), probes)
}
