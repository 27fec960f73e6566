package autoscaler

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestRecommend(t *testing.T) {
	b := bounds{min: 2, max: 10, target: 4}
	for _, tc := range []struct {
		name string
		d    demand
		want int
	}{
		{"leases ask for leases/target members", demand{current: 3, leasable: 3, leases: 17}, 5},
		{"never below min", demand{current: 3, leasable: 3, leases: 1}, 2},
		{"never above max", demand{current: 3, leasable: 3, leases: 400}, 10},
		{"refusals ask for half as many again", demand{current: 4, leasable: 4, leases: 8, refused: 1}, 6},
		{"refusals grow a small pool by one at least", demand{current: 1, leasable: 1, leases: 4, refused: 9}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := recommend(b, tc.d)
			assert.Equal(t, tc.want, got)
			assert.Contains(t, why, fmt.Sprintf("%d live leases on %d leasable members, target 4 per member", tc.d.leases, tc.d.leasable))
			if tc.d.refused > 0 {
				assert.Contains(t, why, fmt.Sprintf("%d leases refused", tc.d.refused))
			}
		})
	}
}

func TestStabilizedTakesTheLargestOfTheWindow(t *testing.T) {
	var h history
	w := time.Minute
	top, full := h.stabilized(5, t0, w)
	assert.Equal(t, 5, top)
	assert.False(t, full, "the window has just begun")
	top, _ = h.stabilized(2, t0.Add(30*time.Second), w)
	assert.Equal(t, 5, top, "the 5 is still in the window")
	top, full = h.stabilized(3, t0.Add(70*time.Second), w)
	assert.Equal(t, 3, top, "the 5 left the window")
	assert.True(t, full)
}

// The scale-down window, on a stepped clock: idle demand shrinks the
// pool only once a whole window has asked for no more, the wait it
// returns is exactly the rest of the window, a scale-up goes at once,
// and a change of size starts the window again.
func TestTheScaleDownWindowByStepping(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	b := bounds{min: 1, max: 8, target: 2}
	const window = 5 * time.Minute
	var h history
	ask := func(d demand) (int, time.Duration) {
		rec, why := recommend(b, d)
		next, _, wait := h.decide(b, d, rec, why, clk.Now(), window)
		return next, wait
	}
	busy := demand{current: 2, leasable: 2, leases: 8}
	next, _ := ask(busy)
	require.Equal(t, 4, next, "8 leases at 2 per member: up at once")
	h.restart(clk.Now())

	idle := demand{current: 4, leasable: 4}
	for _, step := range []time.Duration{0, time.Minute, 3 * time.Minute} {
		clk.Step(step)
		next, wait := ask(idle)
		assert.Equal(t, 4, next, "still in the window %s after the scale-up", clk.Since(t0))
		assert.Equal(t, t0.Add(window).Sub(clk.Now())+10*time.Millisecond, wait, "the wait is the rest of the window")
	}
	clk.Step(time.Minute)
	next, _ = ask(idle)
	assert.Equal(t, 1, next, "a whole window idle: down to minReplicas")
	h.restart(clk.Now())

	// A burst inside the new window holds the size it asked for until it
	// leaves the window.
	clk.Step(time.Minute)
	next, _ = ask(demand{current: 1, leasable: 1, leases: 6})
	assert.Equal(t, 3, next)
	h.restart(clk.Now())
	burstAt := clk.Now()
	clk.Step(4 * time.Minute)
	next, wait := ask(demand{current: 3, leasable: 3})
	assert.Equal(t, 3, next)
	assert.Equal(t, burstAt.Add(window).Sub(clk.Now())+10*time.Millisecond, wait)
	clk.Step(wait)
	next, _ = ask(demand{current: 3, leasable: 3})
	assert.Equal(t, 1, next)
}

// Demand counts active members only; a young member not yet Healthy is
// settling (it may still come up), an old one is not.
func TestDemandOfAPoolsMembers(t *testing.T) {
	pool := &v1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}}
	pool.Spec.Replicas = ptr(int32(3))
	own := []metav1.OwnerReference{{APIVersion: v1.GroupVersion.String(), Kind: "ProxyPool", Name: "p", UID: "u", Controller: ptr(true)}}
	member := func(name string, age time.Duration, healthy bool, mut func(*v1.Proxy)) v1.Proxy {
		px := v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", OwnerReferences: own, CreationTimestamp: metav1.NewTime(t0.Add(-age))}}
		if healthy {
			px.Status.Phase, px.Status.Healthy, px.Status.IP = v1.PhaseReady, true, "127.0.0.1"
			px.Status.InstanceGeneration, px.Status.HealthInstanceGeneration = 1, 1
			px.Status.Conditions = []metav1.Condition{
				{Type: v1.ConditionReady, Status: metav1.ConditionTrue},
				{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue},
			}
		}
		if mut != nil {
			mut(&px)
		}
		return px
	}
	draining := func(px *v1.Proxy) {
		px.Annotations = map[string]string{v1.AnnotationDrainDeadline: t0.Add(time.Hour).Format(time.RFC3339)}
	}
	snap := leaseview.Snapshot{At: t0, Leases: map[string]int32{"ns/a": 3, "ns/b": 2, "ns/d": 9}}
	for _, tc := range []struct {
		name    string
		members []v1.Proxy
		want    demand
	}{
		{"healthy members", []v1.Proxy{member("a", time.Hour, true, nil), member("b", time.Hour, true, nil), member("c", time.Hour, true, nil)},
			demand{current: 3, leasable: 3, leases: 5}},
		{"a young one coming up", []v1.Proxy{member("a", time.Hour, true, nil), member("b", time.Hour, true, nil), member("c", time.Minute, false, nil)},
			demand{current: 3, leasable: 2, leases: 5, settling: true}},
		{"an old one that never came up", []v1.Proxy{member("a", time.Hour, true, nil), member("b", time.Hour, true, nil), member("c", time.Hour, false, nil)},
			demand{current: 3, leasable: 2, leases: 5}},
		{"a draining one counts for nothing", []v1.Proxy{member("a", time.Hour, true, nil), member("b", time.Hour, true, nil), member("c", time.Hour, true, nil), member("d", time.Hour, true, draining)},
			demand{current: 3, leasable: 3, leases: 5}},
		{"fewer active than wanted is settling", []v1.Proxy{member("a", time.Hour, true, nil)},
			demand{current: 3, leasable: 1, leases: 3, settling: true}},
		{"another pool's proxy is not a member", []v1.Proxy{member("a", time.Hour, true, nil), member("b", time.Hour, true, nil), member("c", time.Hour, true, nil),
			member("x", time.Hour, true, func(px *v1.Proxy) { px.OwnerReferences = nil })},
			demand{current: 3, leasable: 3, leases: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, demandOf(pool, tc.members, snap, t0))
		})
	}
}

func ptr[T any](v T) *T { return &v }
