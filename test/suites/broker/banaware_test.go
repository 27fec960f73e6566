package broker

// Ban-aware leasing on real broker processes and a real Redis: outcome
// reports, escalating cooldowns shared by exit IP, the waterfall guard
// and pacing, target caps from TargetPolicies, sticky sessions and
// quarantine.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// status updates a Proxy's status as the controller would.
func (f *fleet) status(name string, mutate func(*v1.Proxy)) {
	f.t.Helper()
	ctx := context.Background()
	var px v1.Proxy
	require.NoError(f.t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, &px))
	mutate(&px)
	require.NoError(f.t, env.Client.Status().Update(ctx, &px))
}

// addBehind adds a proxy whose probes saw egress as its exit IP. As the
// controller does, the exit IP arrives with the first verdict, in one
// status write, so the broker never sees the proxy leasable without it.
func (f *fleet) addBehind(name, ip, egress string) {
	f.t.Helper()
	env.ReadyProxy(f.t, f.ns, name, ip, 3128, map[string]string{"n": name}, false)
	f.status(name, func(px *v1.Proxy) {
		px.Status.EgressIP = egress
		verdict(px, true)
	})
}

// verdict sets the probe verdict as the controller writes it.
func verdict(px *v1.Proxy, healthy bool) {
	px.Status.Healthy = healthy
	c := metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1.ReasonProbeFailed, Message: "written by the test"}
	if healthy {
		c.Status, c.Reason = metav1.ConditionTrue, v1.ReasonProbeSucceeded
	}
	meta.SetStatusCondition(&px.Status.Conditions, c)
}

// setHealthy writes a verdict, as the controller does on a transition.
func (f *fleet) setHealthy(name string, healthy bool) {
	f.t.Helper()
	f.status(name, func(px *v1.Proxy) { verdict(px, healthy) })
}

func (f *fleet) policy(name string, spec v1.TargetPolicySpec) {
	f.t.Helper()
	require.NoError(f.t, env.Client.Create(context.Background(), &v1.TargetPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Spec: spec}))
}

func actions(r rest.Reply) []string {
	var out []string
	for _, a := range r.JSON["actions"].([]any) {
		out = append(out, a.(string))
	}
	return out
}

// reason is the ErrorInfo reason of a REST error answer.
func reason(r rest.Reply) string {
	details, _ := r.JSON["details"].([]any)
	for _, d := range details {
		if s, ok := d.(map[string]any)["reason"].(string); ok {
			return s
		}
	}
	return ""
}

func at(t *testing.T, r rest.Reply, field string) time.Time {
	t.Helper()
	s, ok := r.JSON[field].(string)
	require.True(t, ok, "%s missing in %s", field, r.Body)
	ts, err := time.Parse(time.RFC3339Nano, s)
	require.NoError(t, err)
	return ts
}

// The waterfall: 10 proxies, rate_limited on 6 for one target.
// Half the fleet may cool down; the sixth report paces the target
// instead, and the pace moves AIMD-style with the reports.
func TestWaterfallGuardHoldsAndPacingStarts(t *testing.T) {
	f := newFleet(t)
	for i := range 10 {
		f.add(fmt.Sprintf("p%d", i), fmt.Sprintf("127.0.1.%d", 10+i), map[string]string{"pool": "w"})
	}
	b := startBroker(t, f, proc.StartRedis(t, false), "--cooldown", "1h", "--pacing-initial", "2", "--pacing-min", "0.5", "--pacing-max", "4")
	b.WaitListed(10)

	const shop = `{"selector":{"pool":"w"},"target":"shop.example"}`
	var ids []string
	held := map[string]bool{}
	for range 10 {
		id, p := b.LeaseFor(shop)
		ids = append(ids, id)
		held[p] = true
	}
	require.Len(t, held, 10, "least-loaded spreads the leases one per proxy")
	for _, id := range ids[:5] {
		r := b.Report(id, `{"result":"rate_limited","statusCode":429,"latencyMs":120}`)
		assert.Equal(t, []string{"COOLDOWN_STARTED"}, actions(r), "report #%d", len(ids))
		assert.InDelta(t, time.Hour.Seconds(), at(t, r, "cooldownUntil").Sub(at(t, r, "cooldownStart")).Seconds(), 0.01)
		assert.Equal(t, float64(1), r.JSON["cooldownShared"])
	}
	cooling := func(query string) (n int) {
		list := b.Do("GET", "/v1/proxies?pool=w"+query, "")
		require.Equal(t, 200, list.Status, string(list.Body))
		for _, p := range list.JSON["proxies"].([]any) {
			if p.(map[string]any)["cooldownUntil"] != nil {
				n++
			}
		}
		return n
	}
	assert.Equal(t, 5, cooling("&target=shop.example"), "a list naming the target shows each proxy's cooldown for it")
	assert.Equal(t, 0, cooling("&target=other.example"), "and none for another target")
	assert.Equal(t, 0, cooling(""), "a list naming no target shows none")

	r := b.Report(ids[5], `{"result":"rate_limited","target":"shop.example","statusCode":429}`)
	assert.Equal(t, []string{"GUARD_HELD", "PACING_STARTED"}, actions(r), "the sixth would cool more than half the fleet")
	assert.Nil(t, r.JSON["cooldownUntil"], "no cooldown past the guard")
	assert.Equal(t, float64(2), r.JSON["pacePerSecond"])

	m := b.Metrics()
	assert.Equal(t, float64(5), m[`proxy_operator_broker_cooldowns`])
	assert.Equal(t, float64(2), m[`proxy_operator_broker_target_pace_rate{target="shop.example"}`])
	assert.Equal(t, float64(5), m[`proxy_operator_broker_report_actions_total{action="COOLDOWN_STARTED"}`])
	assert.Equal(t, float64(6), m[`proxy_operator_broker_reports_total{result="rate_limited",status_class="4xx"}`])

	// Paced: at 2/s the burst is spent within a few leases, and the
	// refusal says when the next one is due, over REST and gRPC.
	var refused rest.Reply
	var paced []string
	for range 10 {
		if refused = b.Lease(shop); refused.Status != 200 {
			break
		}
		paced = append(paced, refused.JSON["leaseID"].(string))
	}
	require.Equal(t, 429, refused.Status, string(refused.Body))
	assert.LessOrEqual(t, len(paced), 3, "a 2/s pace grants at most a second's burst")
	require.NotEmpty(t, paced, "pacing grants leases at its rate, it does not stop them")
	assert.Equal(t, "TARGET_PACED", reason(refused))
	assert.Equal(t, "1", refused.Header.Get("Retry-After"), "the next lease is due within the second")
	assert.Equal(t, 200, b.Lease(`{"selector":{"pool":"w"},"target":"other.example"}`).Status, "other targets are not paced")

	conn, err := grpc.NewClient(b.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	c := leasev1.NewLeaseServiceClient(conn)
	var st *status.Status
	for range 50 {
		if _, err := c.CreateLease(context.Background(), &leasev1.CreateLeaseRequest{Selector: map[string]string{"pool": "w"}, Target: "shop.example"}); err != nil {
			st = status.Convert(err)
			break
		}
	}
	require.NotNil(t, st, "a tight loop outruns 2 leases/s")
	assert.Equal(t, codes.ResourceExhausted, st.Code(), st.Message())
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	require.NotNil(t, info)
	require.NotNil(t, retry)
	assert.Equal(t, "TARGET_PACED", info.GetReason())
	assert.Equal(t, "2", info.GetMetadata()["ratePerSecond"])
	assert.Positive(t, retry.GetRetryDelay().AsDuration())
	assert.LessOrEqual(t, retry.GetRetryDelay().AsDuration(), 500*time.Millisecond, "one interval at 2/s")

	// A burst counts once: a lease granted before pacing began was sent
	// at the old rate; one granted since cuts the pace in half.
	assert.Equal(t, []string{"PACE_HELD"}, actions(b.Report(ids[6], `{"result":"rate_limited"}`)))
	r = b.Report(paced[0], `{"result":"rate_limited"}`)
	assert.Equal(t, []string{"PACE_CUT"}, actions(r))
	assert.Equal(t, float64(1), r.JSON["pacePerSecond"])
	assert.Equal(t, []string{"PACE_HELD"}, actions(b.Report(paced[0], `{"result":"rate_limited"}`)), "one cut per burst")

	// ok reports raise it step by step until it reaches the maximum,
	// which ends pacing.
	var rates []float64
	for range 20 {
		r = b.Report(paced[0], `{"result":"ok","statusCode":200}`)
		if a := actions(r); a[len(a)-1] == "PACING_ENDED" {
			break
		}
		assert.Equal(t, []string{"PACE_RAISED"}, actions(r))
		rates = append(rates, r.JSON["pacePerSecond"].(float64))
	}
	require.Equal(t, []string{"PACING_ENDED"}, actions(r), "pacing ends at --pacing-max")
	assert.IsIncreasing(t, rates)
	assert.Equal(t, 2.0, rates[0], "from 1/s an ok adds 1")
	_, still := b.Metrics()[`proxy_operator_broker_target_pace_rate{target="shop.example"}`]
	assert.False(t, still, "no pace once it ended")
	for range 5 {
		assert.Equal(t, 200, b.Lease(shop).Status, "unpaced again")
	}
}

// Cooldowns are kept per exit IP: proxies on one IP share them, a
// replacement landing on the IP inherits them, a repeat within the memory
// window doubles the next one with jitter, and reports racing from two
// brokers start one cooldown, never two.
func TestCooldownsEscalateByExitIPAndRacingReportsNeverDoubleThem(t *testing.T) {
	f := newFleet(t)
	f.addBehind("a1", "127.0.2.1", "127.0.9.1")
	f.addBehind("a2", "127.0.2.2", "127.0.9.1")
	f.addBehind("c", "127.0.2.3", "127.0.9.2")
	r := proc.StartRedis(t, false)
	// 8 s outlasts a Proxy's replacement below on a loaded machine.
	flags := []string{"--cooldown", "8s", "--cooldown-max", "20s", "--cooldown-window", "1m", "--max-cooling-fraction", "1"}
	b1, b2 := startBroker(t, f, r, flags...), startBroker(t, f, r, flags...)
	b1.WaitListed(3)
	b2.WaitListed(3)

	// race reports rate_limited on id from both brokers at once and
	// returns the replies.
	race := func(id string) []rest.Reply {
		var mu sync.Mutex
		var out []rest.Reply
		var wg sync.WaitGroup
		for i := range 16 {
			b := []*broker{b1, b2}[i%2]
			wg.Go(func() {
				r := b.Report(id, `{"result":"rate_limited","target":"t.example"}`)
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			})
		}
		wg.Wait()
		return out
	}
	// one checks that exactly one reply started a cooldown (with want) and
	// every other found it running, all with the same end.
	one := func(replies []rest.Reply, want string) rest.Reply {
		var started rest.Reply
		n := 0
		for _, r := range replies {
			switch a := actions(r); a[0] {
			case want:
				started, n = r, n+1
			default:
				assert.Equal(t, []string{"COOLDOWN_ACTIVE"}, a)
			}
		}
		require.Equal(t, 1, n, "exactly one report starts the cooldown")
		for _, r := range replies {
			assert.Equal(t, started.JSON["cooldownUntil"], r.JSON["cooldownUntil"], "one cooldown, one end")
			assert.Equal(t, started.JSON["cooldownStart"], r.JSON["cooldownStart"], "and one start")
			assert.Equal(t, started.JSON["cooldownShared"], r.JSON["cooldownShared"])
		}
		return started
	}

	id, _ := b1.LeaseFor(`{"selector":{"n":"a1"},"target":"t.example"}`)
	first := one(race(id), "COOLDOWN_STARTED")
	assert.Equal(t, float64(2), first.JSON["cooldownShared"], "a1 and a2 share 127.0.9.1")
	assert.Equal(t, float64(0), first.JSON["cooldownLevel"])
	assert.InDelta(t, 8, at(t, first, "cooldownUntil").Sub(at(t, first, "cooldownStart")).Seconds(), 0.01, "the base period")

	refused := b2.Lease(`{"selector":{"n":"a2"},"target":"t.example"}`)
	assert.Equal(t, 429, refused.Status, "a2 shares a1's exit IP, so its cooldown")
	assert.Equal(t, "ALL_COOLING_DOWN", reason(refused))
	b2.LeaseFor(`{"selector":{"n":"c"},"target":"t.example"}`)
	b2.LeaseFor(`{"selector":{"n":"a2"},"target":"u.example"}`)

	// a2 is replaced by a3 on the same exit IP: a3 inherits the cooldown.
	require.NoError(t, env.Client.Delete(context.Background(), &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "a2"}}))
	f.addBehind("a3", "127.0.2.4", "127.0.9.1")
	b1.WaitListed(3)
	refused = b1.Lease(`{"selector":{"n":"a3"},"target":"t.example"}`)
	assert.Equal(t, 429, refused.Status, "a replacement on a cooling exit IP inherits the cooldown: %s", refused.Body)

	// After it ends, another report within the window escalates: between
	// one and two base periods.
	var again string
	require.Eventually(t, func() bool {
		l := b1.Lease(`{"selector":{"n":"a1"},"target":"t.example"}`)
		if l.Status == 200 {
			again = l.JSON["leaseID"].(string)
		}
		return l.Status == 200
	}, 30*time.Second, 50*time.Millisecond, "the cooldown never ended")
	second := one(race(again), "COOLDOWN_ESCALATED")
	assert.Equal(t, float64(1), second.JSON["cooldownLevel"])
	d := at(t, second, "cooldownUntil").Sub(at(t, second, "cooldownStart"))
	assert.GreaterOrEqual(t, d, 8*time.Second)
	assert.LessOrEqual(t, d, 16*time.Second)
	assert.Equal(t, float64(2), second.JSON["cooldownShared"], "a1 and a3: a2 left with its Proxy")

	// ok lets it decay one level.
	assert.Equal(t, []string{"COOLDOWN_DECAYED"}, actions(b2.Report(again, `{"result":"ok","target":"t.example"}`)))
	assert.Equal(t, []string{"NONE"}, actions(b2.Report(again, `{"result":"ok","target":"t.example"}`)), "already at the base level")
}

// A TargetPolicy caps the fleet's live leases for its targets: two
// brokers granting at once never pass it, and an exact name beats a
// wildcard.
func TestTargetPolicyCapsLeasesAcrossTwoBrokers(t *testing.T) {
	f := newFleet(t)
	for i := range 4 {
		f.add(fmt.Sprintf("p%d", i), fmt.Sprintf("127.0.3.%d", 10+i), nil)
	}
	f.policy("shops", v1.TargetPolicySpec{Targets: []string{"*.example"}, MaxConcurrentLeases: ptr.To[int32](3)})
	f.policy("vip", v1.TargetPolicySpec{Targets: []string{"vip.shop.example"}, MaxConcurrentLeases: ptr.To[int32](1)})
	r := proc.StartRedis(t, false)
	b1, b2 := startBroker(t, f, r), startBroker(t, f, r)
	b1.WaitListed(4)
	b2.WaitListed(4)

	var mu sync.Mutex
	var granted []string
	reasons := map[string]int{}
	var wg sync.WaitGroup
	for i := range 24 {
		b := []*broker{b1, b2}[i%2]
		wg.Go(func() {
			l := b.Lease(`{"target":"Shop.Example"}`)
			mu.Lock()
			defer mu.Unlock()
			if l.Status == 200 {
				granted = append(granted, l.JSON["leaseID"].(string))
				return
			}
			reasons[reason(l)]++
		})
	}
	wg.Wait()
	assert.Len(t, granted, 3, "the cap holds across both brokers")
	assert.Equal(t, map[string]int{"TARGET_AT_CAP": 21}, reasons)

	id, _ := b1.LeaseFor(`{"target":"vip.shop.example"}`)
	assert.Equal(t, "TARGET_AT_CAP", reason(b2.Lease(`{"target":"vip.shop.example"}`)), "the exact policy's cap of 1 wins over the wildcard's 3")
	rep := b1.Report(id, `{"result":"ok"}`)
	assert.Equal(t, f.ns+"/vip", rep.JSON["policy"])

	require.Equal(t, 204, b2.Do("DELETE", "/v1/leases/"+granted[0], "").Status)
	b2.LeaseFor(`{"target":"shop.example"}`)
	assert.Equal(t, "TARGET_AT_CAP", reason(b1.Lease(`{"target":"shop.example"}`)))
}

// A session key keeps its proxy while a lease with it lives and the proxy
// qualifies; otherwise the session moves, and says so.
func TestSessionKeyKeepsItsProxy(t *testing.T) {
	f := newFleet(t)
	for i := range 4 {
		f.add(fmt.Sprintf("p%d", i), fmt.Sprintf("127.0.4.%d", 10+i), nil)
	}
	b := startBroker(t, f, proc.StartRedis(t, false), "--cooldown", "1h", "--max-cooling-fraction", "1")
	b.WaitListed(4)

	first := b.Lease(`{"sessionKey":"login-1","target":"bank.example"}`)
	require.Equal(t, 200, first.Status, string(first.Body))
	assert.Equal(t, false, first.JSON["sessionMoved"])
	home := first.JSON["proxy"].(map[string]any)["id"]
	for range 5 {
		r := b.Lease(`{"sessionKey":"login-1","target":"bank.example"}`)
		require.Equal(t, 200, r.Status)
		assert.Equal(t, home, r.JSON["proxy"].(map[string]any)["id"], "least-loaded would have picked another proxy")
		assert.Equal(t, false, r.JSON["sessionMoved"])
	}
	other := b.Lease(`{"sessionKey":"login-2","target":"bank.example"}`)
	assert.NotEqual(t, home, other.JSON["proxy"].(map[string]any)["id"], "another session takes the least-loaded proxy")

	// The proxy cools down for the target: the session moves.
	b.Report(first.JSON["leaseID"].(string), `{"result":"rate_limited"}`)
	moved := b.Lease(`{"sessionKey":"login-1","target":"bank.example"}`)
	require.Equal(t, 200, moved.Status)
	assert.Equal(t, true, moved.JSON["sessionMoved"])
	assert.NotEqual(t, home, moved.JSON["proxy"].(map[string]any)["id"])
	again := b.Lease(`{"sessionKey":"login-1","target":"bank.example"}`)
	assert.Equal(t, moved.JSON["proxy"].(map[string]any)["id"], again.JSON["proxy"].(map[string]any)["id"], "and stays where it moved")
	assert.Equal(t, false, again.JSON["sessionMoved"])
}

// Errors on several distinct targets blame the proxy: it is quarantined,
// shown as such, refused, and back when the period ends or when it next
// turns healthy.
func TestErrorsOnSeveralTargetsQuarantineTheProxy(t *testing.T) {
	f := newFleet(t)
	f.add("bad", "127.0.5.1", map[string]string{"n": "bad"})
	f.add("good", "127.0.5.2", map[string]string{"n": "good"})
	r := proc.StartRedis(t, false)
	short := startBroker(t, f, r, "--quarantine-targets", "3", "--quarantine-window", "1m", "--quarantine-period", "6s")
	short.WaitListed(2)

	// Each report on a lease for its target: a report counts only for
	// its lease's.
	errorOn := func(b *broker, target string) rest.Reply {
		id, _ := b.LeaseFor(`{"selector":{"n":"bad"},"target":"` + target + `"}`)
		return b.Report(id, `{"result":"error"}`)
	}
	quarantine := func(b *broker) time.Time {
		for _, target := range []string{"a.example", "b.example", "a.example"} {
			assert.Equal(t, []string{"NONE"}, actions(errorOn(b, target)), "two distinct targets are not yet the proxy's fault")
		}
		rep := errorOn(b, "c.example")
		require.Equal(t, []string{"QUARANTINED"}, actions(rep))
		return at(t, rep, "quarantinedUntil")
	}
	// What a quarantine shows, checked under an hour's quarantine so a
	// slow machine cannot outrun it.
	long := startBroker(t, f, r, "--quarantine-targets", "3", "--quarantine-period", "1h")
	long.WaitListed(2)
	until := quarantine(long)
	refused := long.Lease(`{"selector":{"n":"bad"}}`)
	assert.Equal(t, 429, refused.Status)
	assert.Equal(t, "ALL_QUARANTINED", reason(refused), string(refused.Body))
	long.LeaseFor(`{"selector":{"n":"good"}}`)
	for _, p := range long.Do("GET", "/v1/proxies", "").JSON["proxies"].([]any) {
		p := p.(map[string]any)
		if p["id"] != f.ns+"/bad" {
			assert.Nil(t, p["quarantinedUntil"], "%v", p)
			continue
		}
		listed := rest.Reply{JSON: p}
		assert.Equal(t, until, at(t, listed, "quarantinedUntil"))
		assert.Equal(t, time.Hour, until.Sub(at(t, listed, "quarantinedSince")), "the period")
	}
	assert.Equal(t, float64(1), long.Metrics()[`proxy_operator_broker_quarantined_proxies`])

	// Condition times have whole seconds: only a turn in a later second
	// than the quarantine's start is known to follow it.
	time.Sleep(1100 * time.Millisecond)
	f.setHealthy("bad", false)
	f.setHealthy("bad", true)
	require.Eventually(t, func() bool { return long.Lease(`{"selector":{"n":"bad"}}`).Status == 200 },
		15*time.Second, 100*time.Millisecond, "a probe success after the quarantine began did not end it")
	assert.Equal(t, float64(0), long.Metrics()[`proxy_operator_broker_quarantined_proxies`])

	// A short quarantine ends with its period.
	quarantine(short)
	require.Eventually(t, func() bool { return short.Lease(`{"selector":{"n":"bad"}}`).Status == 200 },
		20*time.Second, 100*time.Millisecond, "the quarantine never ended")
	assert.Equal(t, float64(0), short.Metrics()[`proxy_operator_broker_quarantined_proxies`])
}

// With --ban-aware=false the broker keeps the seed's rule: a fixed
// cooldown on rate_limited, nothing else.
func TestBanAwareOffKeepsTheSeedRule(t *testing.T) {
	f := newFleet(t)
	f.add("only", "127.0.6.1", nil)
	b := startBroker(t, f, proc.StartRedis(t, false), "--ban-aware=false", "--cooldown", "1h", "--quarantine-targets", "1")
	b.WaitListed(1)
	id, _ := b.LeaseFor(`{"target":"x.example","sessionKey":"s"}`)
	assert.Equal(t, []string{"NONE"}, actions(b.Report(id, `{"result":"error"}`)), "no quarantine")
	assert.Equal(t, []string{"NONE"}, actions(b.Report(id, `{"result":"blocked"}`)), "blocked does not cool")
	r := b.Report(id, `{"result":"rate_limited"}`)
	assert.Equal(t, []string{"COOLDOWN_STARTED"}, actions(r))
	assert.InDelta(t, time.Hour.Seconds(), at(t, r, "cooldownUntil").Sub(at(t, r, "cooldownStart")).Seconds(), 0.01)
	m := b.Metrics()
	assert.Equal(t, float64(1), m[`proxy_operator_broker_cooldowns`])
	assert.Zero(t, m[`proxy_operator_broker_quarantined_proxies`])
	for k := range m {
		assert.False(t, strings.HasPrefix(k, "proxy_operator_broker_target_pace_rate"), k)
	}
}
