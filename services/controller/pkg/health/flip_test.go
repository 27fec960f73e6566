package health

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
)

// readyFleet creates n Ready, Healthy External proxies in a new
// namespace, 16 at a time, and returns the namespace.
func readyFleet(t *testing.T, n int) string {
	t.Helper()
	ns := env.Namespace(t, "flip")
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				env.ReadyProxy(t, ns, fmt.Sprintf("p%05d", i), fmt.Sprintf("127.1.%d.%d", i/250, i%250+1), 3128, nil, true)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return ns
}

// TestAFleetWideFlipNeverStallsResultIntake is the fleet-wide flip: the
// health target's site goes down and 2,000 proxies fail at once. The
// writes (throttled here to 200/s, as a busy API server would make them)
// take seconds; the probe stream must take in every result meanwhile, a
// second round of results must not add a single write, and in the end each
// proxy is written exactly once.
func TestAFleetWideFlipNeverStallsResultIntake(t *testing.T) {
	testenv.Require(t)
	const n = 2000
	ns := readyFleet(t, n)

	ctx := context.Background()
	slow := rest.CopyConfig(env.Config)
	slow.QPS, slow.Burst = 200, 20
	d := DefaultDefaults
	d.FailureThreshold = 1
	e, addr := watchingHub(t, ns, slow, HubOptions{Defaults: d})

	p := connect(t, addr, "prober-0")
	partitionWithin(t, 30*time.Second, n, p)
	p.mu.Lock()
	failures := make([]*probev1.ProbeResult, 0, n)
	for _, tg := range p.targets {
		failures = append(failures, &probev1.ProbeResult{Id: tg.GetId(), Uid: tg.GetUid(), Phase: probev1.ProbePhase_PROBE_PHASE_STATUS,
			Reason: "target answered 503", Latency: durationpb.New(time.Millisecond), FinishedAt: timestamppb.Now()})
	}
	p.mu.Unlock()
	taken := func() float64 { return resultsCounted(t, "failure") }
	writes := func() float64 { return testutil.ToFloat64(metrics.StatusWrites.WithLabelValues("health")) }
	taken0, writes0 := taken(), writes()

	p.report(t, failures)
	require.Eventually(t, func() bool { return taken() == taken0+n }, 20*time.Second, 5*time.Millisecond, "the stream stopped taking results in")
	pending := queueDepth(t)
	assert.Greater(t, pending, n/2, "every result was taken in while most of the %d writes still waited", n)

	p.report(t, failures) // the site is still down: a second round
	require.Eventually(t, func() bool { return taken() == taken0+2*n }, 20*time.Second, 5*time.Millisecond, "the second round was not taken in")
	assert.Positive(t, queueDepth(t), "the second round too was taken in before the writes drained")

	require.Eventually(t, func() bool {
		list := &v1.ProxyList{}
		require.NoError(t, env.Client.List(ctx, list, client.InNamespace(ns)))
		down := 0
		for _, px := range list.Items {
			if c := healthCond(&px); !px.Status.Healthy && c != nil && c.Status == metav1.ConditionFalse {
				down++
			}
		}
		return down == n
	}, 60*time.Second, 250*time.Millisecond, "not every proxy went Unhealthy")
	require.Eventually(t, e.Idle, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, writes0+n, writes(), "one write per proxy: the second round coalesced into the first")

	px := &v1.Proxy{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "p00042"}, px))
	assert.Equal(t, v1.ReasonProbeFailed, healthCond(px).Reason)
	assert.Equal(t, "status failed: target answered 503", healthCond(px).Message)
}

// watchingHub runs h as the controller does, fed by an informer on ns,
// its engine writing through a client made from cfg, until the test ends.
func watchingHub(t *testing.T, ns string, cfg *rest.Config, o HubOptions) (*Engine, string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	require.NoError(t, err)
	writer, err := client.New(cfg, client.Options{Scheme: env.Scheme, Cache: &client.CacheOptions{Reader: c}})
	require.NoError(t, err)
	o.Addr = "127.0.0.1:0"
	h := NewHub(NewEngine(writer, nil, nil, slog.Default(), EngineOptions{}), closed(), slog.Default(), o)
	addr, err := h.Listen()
	require.NoError(t, err)
	require.NoError(t, h.Watch(ctx, c))
	go func() { _ = c.Start(ctx) }()
	require.True(t, c.WaitForCacheSync(ctx))
	done := make(chan struct{})
	go func() { _ = h.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return h.engine, addr
}

// queueDepth is the health write queue's depth, as its metric says.
func queueDepth(t *testing.T) int {
	return int(sample(t, "workqueue_depth", "name", "proxy_health_status"))
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// A Proxy whose address, or whose health-check URL's host, is in the deny
// list is never given to a prober; it is Healthy=False, ProbeDenied, so it
// is never leased, and the message names the address and the range.
func TestDeniedDestinationsAreNeverProbed(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "deny")
	ctx := context.Background()
	env.ReadyProxy(t, ns, "metadata", "169.254.169.254", 80, nil, true)
	env.ReadyProxy(t, ns, "fine", "127.0.0.50", 3128, nil, false)
	viaURL := env.ReadyProxy(t, ns, "via-url", "127.0.0.51", 3128, nil, true)
	viaURL.Spec.HealthCheck = &v1.HealthCheck{URL: "http://169.254.169.254/computeMetadata/v1/"}
	require.NoError(t, env.Client.Update(ctx, viaURL))
	// A proxy in a private range is fine; a health check pointed into one
	// would have the fleet scan the proxies' network.
	scan := env.ReadyProxy(t, ns, "scan", "127.0.0.52", 3128, nil, true)
	scan.Spec.HealthCheck = &v1.HealthCheck{URL: "https://10.1.2.3:6443/"}
	require.NoError(t, env.Client.Update(ctx, scan))
	deny, err := netpolicy.Parse(netpolicy.DefaultDenyCIDRs)
	require.NoError(t, err)
	egress, err := netpolicy.ParseEgress(netpolicy.DefaultEgressDenyCIDRs, "127.0.0.1/32", netpolicy.DefaultEgressPorts, netpolicy.DefaultEgressTLSPorts)
	require.NoError(t, err)
	_, addr := watchingHub(t, ns, env.Config, HubOptions{Defaults: DefaultDefaults, Deny: deny, Egress: egress})

	p := connect(t, addr, "deny-prober")
	assert.Equal(t, map[string]bool{ns + "/fine": true}, partition(t, 1, p)[0], "only the allowed proxy is probed")
	for name, want := range map[string]string{
		"metadata": "the proxy's address 169.254.169.254 is in --probe-deny-cidrs (169.254.0.0/16)",
		"via-url":  "the health-check URL 169.254.169.254 is outside the egress policy (169.254.169.254 is in the deny list (169.254.0.0/16))",
		"scan":     "the health-check URL 10.1.2.3:6443 is outside the egress policy (10.1.2.3 is in the deny list (10.0.0.0/8))",
	} {
		px := &v1.Proxy{}
		require.Eventually(t, func() bool {
			require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, px))
			c := healthCond(px)
			return c != nil && c.Reason == v1.ReasonProbeDenied
		}, 10*time.Second, 10*time.Millisecond, "%s was not refused", name)
		assert.False(t, px.Status.Healthy, "%s is not leasable", name)
		assert.Equal(t, metav1.ConditionFalse, healthCond(px).Status)
		assert.Contains(t, healthCond(px).Message, want)
	}

	// Its URL fixed, the proxy is probed from scratch, and status no
	// longer says it is refused.
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(viaURL), viaURL))
	viaURL.Spec.HealthCheck.URL = "https://127.0.0.1:1/"
	require.NoError(t, env.Client.Update(ctx, viaURL))
	assert.Equal(t, map[string]bool{ns + "/fine": true, ns + "/via-url": true}, partition(t, 2, p)[0])
	require.Eventually(t, func() bool {
		px := &v1.Proxy{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(viaURL), px))
		c := healthCond(px)
		return c.Status == metav1.ConditionUnknown && c.Reason == v1.ReasonNotProbed
	}, 10*time.Second, 10*time.Millisecond, "status still says the proxy is refused")
}
