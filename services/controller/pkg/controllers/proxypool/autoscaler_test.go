package proxypool_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// Demand scaling: the pool grows on live leases above the target and on
// refused leases that would have matched it, shrinks after the
// stabilization window when idle, stays within its bounds, and says why
// in an Event each time.
func TestAutoscalingFollowsLeaseDemand(t *testing.T) {
	h := newHarness(t).start()
	p := h.pool("auto", 1)
	p.Spec.Autoscaling = &v1.Autoscaling{MinReplicas: 1, MaxReplicas: 4, TargetLeasesPerProxy: 2, ScaleDownStabilization: seconds(2)}
	h.create(p)
	h.waitSteady("auto", 1)
	replicas := func() int32 { return *h.get("auto").Spec.Replicas }

	h.leases.set(h.ns+"/auto-0", 5)
	require.Eventually(t, func() bool { return replicas() == 3 }, 30*time.Second, 50*time.Millisecond, "5 leases at 2 per member ask for 3")
	h.waitEvent("auto", v1.EventScaled, "scaled from 1 to 3 members: 5 live leases on 1 leasable members, target 2 per member")
	h.waitSteady("auto", 3)

	// Refused leases for a selector the pool's attributes meet; another
	// namespace's, and a selector the pool does not meet, do not count.
	h.leases.refuse(
		leaseview.Refusal{Namespace: h.ns, Selector: map[string]string{"geo": "eu"}, Count: 7},
		leaseview.Refusal{Namespace: "elsewhere", Selector: map[string]string{"geo": "eu"}, Count: 100},
		leaseview.Refusal{Selector: map[string]string{"geo": "us"}, Count: 100},
	)
	require.Eventually(t, func() bool { return replicas() == 4 }, 30*time.Second, 50*time.Millisecond, "refusals grow the pool, to maxReplicas")
	h.waitEvent("auto", v1.EventScaled, "7 leases refused in the last 1m0s")
	h.waitSteady("auto", 4)
	require.Never(t, func() bool { return replicas() > 4 }, time.Second, 50*time.Millisecond, "never above maxReplicas")

	// Idle: back to minReplicas, but only after the window.
	// (Leases first: with the refusals gone and 5 leases, demand would
	// ask for 3 on the way.)
	h.leases.set(h.ns+"/auto-0", 0)
	h.leases.refuse()
	idle := time.Now()
	require.Eventually(t, func() bool { return replicas() == 1 }, 30*time.Second, 50*time.Millisecond, "an idle pool shrinks to minReplicas")
	// The window runs from the last recommendation of 4, a poll (50 ms)
	// or so before the refusals stopped.
	assert.GreaterOrEqual(t, time.Since(idle), 1500*time.Millisecond, "after the stabilization window")
	h.waitEvent("auto", v1.EventScaled, "scaled from 4 to 1 members")
	h.waitSteady("auto", 1)
}
