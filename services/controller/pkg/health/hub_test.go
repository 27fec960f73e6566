package health

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/assignment"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
)

// startHub serves a hub on loopback with n targets; leader says whether
// this replica leads.
func startHub(t *testing.T, n int, leader bool, tok *auth.Token) (*Hub, string) {
	t.Helper()
	return startHubWith(t, DefaultDefaults, "127.0.0.1", n, leader, tok)
}

// startHubWith is startHub with the probe defaults and the targets' address.
func startHubWith(t *testing.T, d Defaults, ip string, n int, leader bool, tok *auth.Token) (*Hub, string) {
	t.Helper()
	elected := make(chan struct{})
	if leader {
		close(elected)
	}
	h := NewHub(NewEngine(nil, nil, nil, slog.Default(), EngineOptions{}), elected, slog.Default(), HubOptions{Defaults: d, Addr: "127.0.0.1:0", Token: tok})
	addr, err := h.Listen()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.targets != nil }, 5*time.Second, 10*time.Millisecond)
	for i := range n {
		h.upsert(&v1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%03d", i), Namespace: "ns", UID: types.UID(fmt.Sprintf("uid-%d", i))},
			Status:     v1.ProxyStatus{Phase: v1.PhaseReady, IP: ip, Port: int32(10000 + i)},
		})
	}
	return h, addr
}

// fakeProber speaks the probe protocol and records its assignment.
type fakeProber struct {
	id      string
	mu      sync.Mutex
	set     map[string]bool
	targets map[string]*probev1.ProbeTarget
	fulls   int
	msgs    int
	asm     assignment.Assembler
	stream  probev1.ProbeService_ConnectClient
	cancel  context.CancelFunc
	done    chan error
}

// report sends results as the prober does, in batches of 256.
func (p *fakeProber) report(t *testing.T, rs []*probev1.ProbeResult) {
	t.Helper()
	for len(rs) > 0 {
		n := min(len(rs), 256)
		require.NoError(t, p.stream.Send(&probev1.ConnectRequest{Message: &probev1.ConnectRequest_Results{Results: &probev1.ProbeResults{Results: rs[:n]}}}))
		rs = rs[n:]
	}
}

func connect(t *testing.T, addr, id string, md ...string) *fakeProber {
	t.Helper()
	return connectWith(t, addr, id, insecure.NewCredentials(), md...)
}

func connectWith(t *testing.T, addr, id string, creds credentials.TransportCredentials, md ...string) *fakeProber {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	if len(md) > 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, md...)
	}
	p := &fakeProber{id: id, set: map[string]bool{}, targets: map[string]*probev1.ProbeTarget{}, cancel: cancel, done: make(chan error, 1)}
	stream, err := probev1.NewProbeServiceClient(conn).Connect(ctx)
	if err != nil { // no transport: a TLS handshake refused, say
		p.done <- err
		t.Cleanup(cancel)
		return p
	}
	p.stream = stream
	// A hub that refuses the stream may end it before the hello is sent:
	// gRPC reports that as EOF on Send, and the status reaches Recv below.
	if err := stream.Send(&probev1.ConnectRequest{Message: &probev1.ConnectRequest_Hello{Hello: &probev1.Hello{ProberId: id, Capacity: 8}}}); !errors.Is(err, io.EOF) {
		require.NoError(t, err)
	}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				p.done <- err
				return
			}
			p.mu.Lock()
			p.msgs++
			if a := p.asm.Add(m.GetAssignment()); a != nil {
				if a.GetFull() {
					p.set = map[string]bool{}
					p.targets = map[string]*probev1.ProbeTarget{}
					p.fulls++
				}
				for _, tg := range a.GetUpsert() {
					p.set[tg.GetId()] = true
					p.targets[tg.GetId()] = tg
				}
				for _, id := range a.GetRemove() {
					delete(p.set, id)
					delete(p.targets, id)
				}
			}
			p.mu.Unlock()
		}
	}()
	t.Cleanup(cancel)
	return p
}

func (p *fakeProber) snapshot() map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]bool, len(p.set))
	for k := range p.set {
		out[k] = true
	}
	return out
}

// partition waits until the probers' sets cover n targets exactly once,
// every prober holding some when the fleet is large enough.
func partition(t *testing.T, n int, ps ...*fakeProber) []map[string]bool {
	t.Helper()
	return partitionWithin(t, 10*time.Second, n, ps...)
}

// partitionWithin is partition with its own limit, for fleets that take
// long to send under -race.
func partitionWithin(t *testing.T, limit time.Duration, n int, ps ...*fakeProber) []map[string]bool {
	t.Helper()
	var sets []map[string]bool
	require.Eventually(t, func() bool {
		sets = sets[:0]
		seen := map[string]int{}
		for _, p := range ps {
			s := p.snapshot()
			if len(s) == 0 && n >= len(ps)*16 {
				return false // a connected prober gets a share of any sizeable fleet
			}
			sets = append(sets, s)
			for k := range s {
				seen[k]++
			}
		}
		if len(seen) != n {
			return false
		}
		for _, c := range seen {
			if c != 1 {
				return false
			}
		}
		return true
	}, limit, limit/500, "assignment never became a partition of %d targets", n)
	return sets
}

func TestEveryProxyHasExactlyOneProberAndMovementIsMinimal(t *testing.T) {
	const n = 300
	_, addr := startHub(t, n, true, nil)
	a, b, c := connect(t, addr, "prober-a"), connect(t, addr, "prober-b"), connect(t, addr, "prober-c")
	sets := partition(t, n, a, b, c)
	for i, s := range sets {
		assert.InDelta(t, n/3, len(s), n/6, "prober %d holds a fair share (%d)", i, len(s))
	}

	// b dies: its share, and only its share, moves.
	c0, a0 := sets[2], sets[0]
	b.cancel()
	after := partition(t, n, a, c)
	for k := range a0 {
		assert.True(t, after[0][k], "a kept %s", k)
	}
	for k := range c0 {
		assert.True(t, after[1][k], "c kept %s", k)
	}

	// b comes back: only what it wins moves to it; a and c lose nothing else.
	b2 := connect(t, addr, "prober-b")
	back := partition(t, n, a, b2, c)
	moved := 0
	for k := range after[0] {
		if !back[0][k] {
			moved++
			assert.True(t, back[1][k], "%s left a only for the returning prober", k)
		}
	}
	for k := range after[1] {
		if !back[2][k] {
			moved++
			assert.True(t, back[1][k], "%s left c only for the returning prober", k)
		}
	}
	assert.Equal(t, len(back[1]), moved, "movement is exactly the returning prober's share")
	assert.Equal(t, sets[1], back[1], "rendezvous hashing gives b back the same share")
}

func TestTargetChangesReachOnlyTheirProber(t *testing.T) {
	h, addr := startHub(t, 10, true, nil)
	a, b := connect(t, addr, "a"), connect(t, addr, "b")
	partition(t, 10, a, b)
	h.upsert(&v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ns", UID: "uid-new"}, Status: v1.ProxyStatus{Phase: v1.PhaseReady, IP: "127.0.0.1", Port: 9}})
	partition(t, 11, a, b)
	h.remove("ns/p000", "uid-0")
	h.remove("ns/p001", "uid-1")
	sets := partition(t, 9, a, b)
	assert.NotContains(t, sets[0], "ns/p000")
	assert.NotContains(t, sets[1], "ns/p000")
	// A Proxy that is not Ready (being replaced) is not probed.
	h.upsert(&v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ns", UID: "uid-new"}, Status: v1.ProxyStatus{Phase: v1.PhaseReplacing}})
	partition(t, 8, a, b)
	assert.Equal(t, 1, a.fulls, "one full assignment per stream, deltas after")
}

// A proxy that stops being a target takes its probe-recency series with it.
func TestARemovedTargetLeavesNoSeries(t *testing.T) {
	h, _ := startHub(t, 3, true, nil)
	for i := range 3 {
		h.engine.Handle(context.Background(), "p", &probev1.ProbeResult{Id: fmt.Sprintf("ns/p%03d", i), Uid: fmt.Sprintf("uid-%d", i), Success: true})
	}
	before := lastCheckSeries(t)
	h.remove("ns/p001", "uid-1")
	assert.Equal(t, before-1, lastCheckSeries(t))
	h.engine.Handle(context.Background(), "p", &probev1.ProbeResult{Id: "ns/p001", Uid: "uid-1", Success: true})
	assert.Equal(t, before-1, lastCheckSeries(t), "a late result about it adds none back")
}

func TestFollowerRefusesAndTokenIsRequired(t *testing.T) {
	_, follower := startHub(t, 1, false, nil)
	p := connect(t, follower, "x")
	select {
	case err := <-p.done:
		assert.Equal(t, codes.Unavailable, status.Code(err))
		assert.Contains(t, err.Error(), "not the leader")
	case <-time.After(5 * time.Second):
		t.Fatal("a follower accepted the stream")
	}

	_, guarded := startHub(t, 1, true, auth.Static("probe-secret"))
	bad := connect(t, guarded, "y")
	select {
	case err := <-bad.done:
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
	case <-time.After(5 * time.Second):
		t.Fatal("an unauthenticated prober was accepted")
	}
	good := connect(t, guarded, "z", "authorization", "Bearer probe-secret")
	partition(t, 1, good)
}

// A fleet of 50,000 with 2,000-byte health URLs is about 100 MiB of
// assignment. Both a client with gRPC's default 4 MiB receive limit and the
// real prober binary receive all of it, and the prober probes it.
func TestFiftyThousandTargetsReachARealProber(t *testing.T) {
	proc.RequireProcesses(t)
	const n = 50000
	d := DefaultDefaults
	d.URL = "https://127.0.0.1:1/" + strings.Repeat("x", 2000)
	d.Interval = time.Hour
	d.FailureThreshold = 100 // no verdict, so no write: this hub has no API server
	// Nothing listens on 127.77.0.1: every probe fails at dial, on loopback.
	_, addr := startHubWith(t, d, "127.77.0.1", n, true, nil)

	p := connect(t, addr, "default-limits")
	partitionWithin(t, time.Minute, n, p)
	p.mu.Lock()
	assert.Greater(t, p.msgs, 50, "the set came in chunks")
	p.mu.Unlock()
	p.cancel()

	ops := proc.Addr(proc.FreePort(t))
	prober := proc.Start(t, "prober", proc.Build(t, "github.com/egress-proxies/egress-proxies/services/prober/cmd/prober"),
		"--controller-addr", addr, "--controller-insecure", "--id", "real", "--ops-addr", ops)
	proc.WaitHTTP(t, prober, "http://"+ops+"/healthz", 60*time.Second)
	metric := func(name string) float64 {
		m, err := promtext.Scrape(nil, "http://"+ops+"/metrics")
		if err != nil {
			return -1
		}
		return m[name]
	}
	require.Eventually(t, func() bool { return metric("proxy_operator_prober_assigned_targets") == n }, 60*time.Second, 100*time.Millisecond,
		"the prober never held all %d targets; log %s", n, prober.LogPath)
	assert.Equal(t, 1.0, metric("proxy_operator_prober_connected"))
	failedBefore := resultsCounted(t, "failure")
	require.Eventually(t, func() bool { return resultsCounted(t, "failure") > failedBefore+1000 },
		60*time.Second, 100*time.Millisecond, "results did not come back from the prober")
}

// lastCheckSeries counts the engine's per-proxy probe-recency series.
func lastCheckSeries(t *testing.T) int {
	t.Helper()
	n, err := testutil.GatherAndCount(ctrlmetrics.Registry, "proxy_operator_healthcheck_last_timestamp_seconds")
	require.NoError(t, err)
	return n
}

// seriesOf is the proxies ("namespace/name") with a probe-recency series.
func seriesOf(t *testing.T) map[string]bool {
	t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	require.NoError(t, err)
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "proxy_operator_healthcheck_last_timestamp_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ns, name string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "namespace":
					ns = l.GetValue()
				case "name":
					name = l.GetValue()
				}
			}
			out[ns+"/"+name] = true
		}
	}
	return out
}

// resultsCounted is how many results of a kind the engine has taken in.
func resultsCounted(t *testing.T, result string) float64 {
	return sample(t, "proxy_operator_healthcheck_total", "result", result)
}

// The controller's app registers the package's metrics; so do its tests.
func init() { ctrlmetrics.Registry.MustRegister(Collectors()...) }

// sample is one series of the registry the controller serves.
func sample(t *testing.T, name, label, value string) float64 {
	t.Helper()
	v, err := promtext.Gathered(ctrlmetrics.Registry, name, label, value)
	require.NoError(t, err)
	return v
}

func rejectedCount(t *testing.T, reason string) float64 {
	t.Helper()
	return testutil.ToFloat64(rejected.WithLabelValues(reason))
}

// A stream speaks only for the proxies assigned to it: results about
// another prober's proxies, or naming a wrong uid, are refused and create
// no per-proxy series; an egress IP that is not an IP refuses the result;
// and a second stream under a live prober's id is refused, not let in to
// evict it.
func TestAStreamSpeaksOnlyForItsOwnProxies(t *testing.T) {
	_, addr := startHub(t, 40, true, nil)
	a, b := connect(t, addr, "trust-a"), connect(t, addr, "trust-b")
	sets := partition(t, 40, a, b)
	require.NotEmpty(t, sets[0])
	require.NotEmpty(t, sets[1])
	ok := func(id string, p *fakeProber) *probev1.ProbeResult {
		p.mu.Lock()
		defer p.mu.Unlock()
		return &probev1.ProbeResult{Id: id, Uid: p.targets[id].GetUid(), Success: true}
	}
	series0, unassigned0, invalid0 := seriesOf(t), rejectedCount(t, "unassigned"), rejectedCount(t, "invalid")

	var foreign []*probev1.ProbeResult
	for id := range sets[1] {
		foreign = append(foreign, ok(id, b))
	}
	a.report(t, foreign)
	var own, forged []*probev1.ProbeResult
	for id := range sets[0] {
		r := ok(id, a)
		own = append(own, r)
		forged = append(forged, &probev1.ProbeResult{Id: id, Uid: "not-its-uid", Success: true})
	}
	a.report(t, forged)
	bad := ok(own[0].GetId(), a)
	bad.EgressIp = "<script>alert(1)</script>"
	a.report(t, []*probev1.ProbeResult{bad})
	a.report(t, own)
	require.Eventually(t, func() bool {
		now := seriesOf(t)
		for _, r := range own {
			if !now[r.GetId()] {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "a's own results made series")
	now := seriesOf(t)
	for _, r := range foreign {
		assert.Equal(t, series0[r.GetId()], now[r.GetId()], "a's results about %s made no series", r.GetId())
	}
	assert.Equal(t, unassigned0+float64(len(foreign)+len(forged)), rejectedCount(t, "unassigned"))
	assert.Equal(t, invalid0+1, rejectedCount(t, "invalid"))

	dup := connect(t, addr, "trust-b")
	select {
	case err := <-dup.done:
		assert.Equal(t, codes.AlreadyExists, status.Code(err))
		assert.Contains(t, err.Error(), `prober_id "trust-b" is connected`)
	case <-time.After(5 * time.Second):
		t.Fatal("a second stream under a live id was let in")
	}
	assert.Equal(t, sets, partition(t, 40, a, b), "the live prober kept its share")
}

// The stream served over TLS admits a prober that trusts the controller's
// CA, and no other: not one in plaintext, not one trusting another CA.
func TestTheStreamRunsOverTLS(t *testing.T) {
	ca, err := certs.NewCA("probe CA")
	require.NoError(t, err)
	files, err := ca.WriteServer(t.TempDir(), "127.0.0.1")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served, err := certs.NewReloading(ctx, slog.Default(), files.Cert, files.Key)
	require.NoError(t, err)
	h := NewHub(NewEngine(nil, nil, nil, slog.Default(), EngineOptions{}), closed(), slog.Default(), HubOptions{Defaults: DefaultDefaults, Addr: "127.0.0.1:0", TLS: served.ServerConfig()})
	addr, err := h.Listen()
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { _ = h.Start(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, func() bool { h.mu.Lock(); defer h.mu.Unlock(); return h.targets != nil }, 5*time.Second, 10*time.Millisecond)
	h.upsert(&v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "ns", UID: "uid-tls"}, Status: v1.ProxyStatus{Phase: v1.PhaseReady, IP: "127.0.0.1", Port: 1}})

	other, err := certs.NewCA("another CA")
	require.NoError(t, err)
	for name, creds := range map[string]credentials.TransportCredentials{
		"plaintext":  insecure.NewCredentials(),
		"another CA": credentials.NewTLS(&tls.Config{RootCAs: other.Pool(), MinVersion: tls.VersionTLS12}),
	} {
		p := connectWith(t, addr, "refused", creds)
		select {
		case err := <-p.done:
			assert.Equal(t, codes.Unavailable, status.Code(err), "%s: %v", name, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("a prober connecting with %s was let in", name)
		}
	}
	cfg, err := certs.ClientConfig(files.CA, "")
	require.NoError(t, err)
	p := connectWith(t, addr, "trusted", credentials.NewTLS(cfg))
	assert.Equal(t, map[string]bool{"ns/tls": true}, partition(t, 1, p)[0])
}
