package demo

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// proxies creates n managed proxies in ns and waits until each is Healthy.
func proxies(t *testing.T, ns string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("p%d", i)
		require.NoError(t, env.Client.Create(context.Background(), managed(ns, names[i])))
	}
	for _, name := range names {
		waitProxy(t, ns, name, "Ready and Healthy", healthy)
	}
	return names
}

// election is the leader-election Lease as the API server has it.
func election(t *testing.T) *coordinationv1.Lease {
	t.Helper()
	l := &coordinationv1.Lease{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: "egress-proxies-system", Name: "egress-proxies-controller"}, l))
	return l
}

// newLeader waits for an election after prev (a new holder of the Lease),
// and returns the replica that won it and when it did, by the API
// server's record. The winner may be a restarted replica of any index.
func newLeader(t *testing.T, s *system.System, prev *coordinationv1.Lease) (int, time.Time) {
	t.Helper()
	leader := -1
	var l *coordinationv1.Lease
	require.Eventually(t, func() bool {
		l = election(t)
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == *prev.Spec.HolderIdentity || l.Spec.AcquireTime == nil {
			return false
		}
		leader = s.Leader()
		return leader >= 0
	}, 60*time.Second, 50*time.Millisecond, "no new leader after %s", *prev.Spec.HolderIdentity)
	return leader, l.Spec.AcquireTime.Time
}

// probedWithin asserts that replica i, once elected at since, received a
// probe of every named proxy that ended within bound of its election. It
// reads the leader's own per-proxy probe times, so a slow test process
// does not move what is measured.
func probedWithin(t *testing.T, s *system.System, i int, ns string, names []string, since time.Time, bound time.Duration) {
	t.Helper()
	first := map[string]time.Time{}
	require.Eventually(t, func() bool {
		m, err := promtext.Scrape(nil, "http://"+s.Controllers[i].Metrics+"/metrics")
		if err != nil {
			return false
		}
		for _, name := range names {
			v := m[fmt.Sprintf(`proxy_operator_healthcheck_last_timestamp_seconds{name=%q,namespace=%q}`, name, ns)]
			at := time.UnixMilli(int64(v * 1000))
			if _, ok := first[name]; !ok && !at.Before(since) {
				first[name] = at
			}
		}
		return len(first) == len(names)
	}, 60*time.Second, 100*time.Millisecond, "the new leader never heard of every proxy; probed so far: %v", first)
	var latest time.Duration
	for name, at := range first {
		assert.LessOrEqual(t, at.Sub(since), bound, "%s was first probed %s after the election", name, at.Sub(since))
		latest = max(latest, at.Sub(since))
	}
	t.Logf("every proxy probed for the new leader within %s of its election (bound %s)", latest.Round(time.Millisecond), bound)
}

// Two controller replicas behind a per-connection round-robin balancer, as
// the chart's two replicas are behind their Service: a follower refuses the
// probe stream, and probers must still find the leader, every time it
// changes, and every proxy must be probed for the new leader within two
// intervals of its election.
func TestProbingFollowsTheLeaderBehindARoundRobinService(t *testing.T) {
	const interval = 5 * time.Second
	s, ns := up(t, system.Options{Controllers: 2, Probers: 2, HealthInterval: interval})
	names := proxies(t, ns, 4)

	// The leader is killed: no goodbye, its Lease runs out.
	old := s.Leader()
	require.GreaterOrEqual(t, old, 0)
	prev := election(t)
	s.Controllers[old].Proc.Kill()
	leader, at := newLeader(t, s, prev)
	probedWithin(t, s, leader, ns, names, at, 2*interval)
	s.StartController(old) // its pod restarts, as a follower

	// A rollout: both restart in turn, the follower first.
	prev = election(t)
	follower := 1 - leader
	s.Controllers[follower].Proc.Kill()
	s.StartController(follower)
	s.Controllers[leader].Proc.Kill()
	s.StartController(leader)
	next, at := newLeader(t, s, prev)
	probedWithin(t, s, next, ns, names, at, 2*interval)
	for _, name := range names {
		assert.True(t, waitProxy(t, ns, name, "Healthy throughout", healthy).Status.Healthy)
	}

	// A prober starting while nothing else dials: the balancer alternates,
	// so of two starts in a row one lands on the follower first. Each
	// must reach the leader all the same.
	for range 2 {
		s.Probers[0].Kill()
		s.StartProber(0)
		require.Eventually(t, func() bool {
			m, err := promtext.Scrape(nil, "http://"+s.ProberOps[0]+"/metrics")
			return err == nil && m["proxy_operator_prober_connected"] == 1
		}, 4*interval, 50*time.Millisecond, "the prober never reached the leader; log %s", s.Probers[0].LogPath)
	}
}

// Every prober stops: within the stale limit and one interval, no proxy is
// Healthy, the broker lists none as healthy and refuses leases saying that
// health is stale; probers coming back make them leasable again.
func TestAStoppedProbeFleetMakesHealthStale(t *testing.T) {
	const interval = 2 * time.Second
	s, ns := up(t, system.Options{Probers: 2, HealthInterval: interval})
	names := proxies(t, ns, 3)
	b := s.Brokers[0].REST
	require.Eventually(t, func() bool { return listedIn(t, b, ns) == len(names) }, 30*time.Second, 50*time.Millisecond)

	stopped := time.Now()
	for _, p := range s.Probers {
		p.Kill()
	}
	// What is timed is the controller's decision, by the time it wrote on
	// the condition (to the second, rounded down), not how soon this test
	// gets to look: the bound holds on a busy machine.
	var latest time.Duration
	for _, name := range names {
		px := waitProxy(t, ns, name, "stale", func(px *v1.Proxy) bool {
			c := healthCondition(px)
			return c != nil && c.Reason == v1.ReasonProbeStale
		})
		c := healthCondition(px)
		assert.Equal(t, "Unknown", string(c.Status))
		assert.False(t, px.Status.Healthy)
		latest = max(latest, c.LastTransitionTime.Sub(stopped))
	}
	assert.LessOrEqual(t, latest, (3+1)*interval, "stale %s after every prober stopped", latest)
	t.Logf("every proxy stale %s after every prober stopped (bound %s; the transition time is to the second)", latest, (3+1)*interval)
	require.Eventually(t, func() bool { return listedIn(t, b, ns) == 0 }, 30*time.Second, 50*time.Millisecond,
		"the broker still lists healthy proxies with every proxy stale")
	refused := rest.Do(t, "POST", b+"/v1/leases", `{"namespace":"`+ns+`"}`)
	assert.Equal(t, 429, refused.Status)
	assert.Contains(t, string(refused.Body), "HEALTH_STALE")
	assert.Contains(t, string(refused.Body), "health of 3 matching proxies is stale")
	ctrl, err := promtext.Scrape(nil, "http://"+s.Controllers[0].Metrics+"/metrics")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, ctrl["proxy_operator_proxies_probe_stale"], float64(len(names)))

	for i := range s.Probers {
		s.StartProber(i)
	}
	require.Eventually(t, func() bool { return listedIn(t, b, ns) == len(names) }, 30*time.Second, 50*time.Millisecond,
		"probers back, the proxies are leasable again")
	assert.Equal(t, 200, rest.Do(t, "POST", b+"/v1/leases", `{"namespace":"`+ns+`"}`).Status)
}

func healthCondition(px *v1.Proxy) *metav1.Condition {
	return meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy)
}

// listedIn counts the healthy proxies of ns the broker lists.
func listedIn(t *testing.T, broker, ns string) int {
	n := 0
	for id := range listed(t, broker) {
		if strings.HasPrefix(id, ns+"/") {
			n++
		}
	}
	return n
}

// Error reports on three targets quarantine a proxy for the default half
// hour; the prober's next success ends it: the controller, which reads
// the quarantine from the brokers, writes that success to status, and
// the brokers, which see probes only there, let the proxy back.
func TestAQuarantineEndsAtTheProbersNextSuccess(t *testing.T) {
	s, ns := up(t, system.Options{})
	proxies(t, ns, 1)
	b0, b1 := s.Brokers[0].REST, s.Brokers[1].REST
	before := time.Now()
	var rep rest.Reply
	for i, target := range []string{"a.example", "b.example", "c.example"} {
		// A lease per target: a report counts only for its lease's.
		l := rest.Do(t, "POST", b0+"/v1/leases", `{"namespace":"`+ns+`","target":"`+target+`"}`)
		require.Equal(t, 200, l.Status, string(l.Body))
		id := l.JSON["leaseID"].(string)
		rep = rest.Do(t, "POST", []string{b0, b1}[i%2]+"/v1/leases/"+id+"/report", `{"result":"error","target":"`+target+`"}`)
		require.Equal(t, 200, rep.Status, string(rep.Body))
	}
	require.Contains(t, string(rep.Body), "QUARANTINED")
	until, err := time.Parse(time.RFC3339Nano, rep.JSON["quarantinedUntil"].(string))
	require.NoError(t, err)
	assert.Greater(t, time.Until(until), 25*time.Minute, "the default period")
	refused := rest.Do(t, "POST", b1+"/v1/leases", `{"namespace":"`+ns+`"}`)
	assert.Equal(t, 429, refused.Status, string(refused.Body))

	// leaseOnce gives up after 30 s: far inside the half hour.
	back := leaseOnce(t, b1, ns)
	assert.Equal(t, ns+"/p0", back.JSON["proxy"].(map[string]any)["id"])
	px := waitProxy(t, ns, "p0", "confirmed", func(px *v1.Proxy) bool { return px.Status.LastHealthCheckTime != nil })
	assert.False(t, px.Status.LastHealthCheckTime.Time.Before(before.Truncate(time.Second)), "the success written follows the quarantine")
	for _, b := range []string{b0, b1} {
		list := rest.Do(t, "GET", b+"/v1/proxies?namespace="+ns, "")
		assert.Nil(t, list.JSON["proxies"].([]any)[0].(map[string]any)["quarantinedUntil"], "%s still shows it quarantined", b)
	}
}
