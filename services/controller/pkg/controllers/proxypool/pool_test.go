package proxypool_test

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

func names(ps []v1.Proxy) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	sort.Strings(out)
	return out
}

func TestAPoolKeepsItsReplicasThroughScaleAndInPlaceChanges(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	pool := h.create(h.pool("web", 3))
	h.waitSteady("web", 3)

	ms := h.members()
	assert.Equal(t, []string{"web-0", "web-1", "web-2"}, names(ms))
	for _, px := range ms {
		owner := metav1.GetControllerOf(&px)
		require.NotNil(t, owner, "%s has a controller", px.Name)
		assert.Equal(t, pool.UID, owner.UID)
		assert.True(t, *owner.BlockOwnerDeletion)
		assert.Equal(t, "web", px.Labels[v1.LabelPool])
		assert.NotEmpty(t, px.Labels[v1.LabelTemplateHash])
		assert.Equal(t, "crawl", px.Labels["team"])
		assert.Equal(t, v1.ModeManaged, px.Spec.Mode)
		assert.Equal(t, map[string]string{"geo": "eu"}, px.Spec.Attributes)
	}

	// The /scale subresource, as kubectl scale and an HPA use it.
	scale := &autoscalingv1.Scale{}
	require.NoError(t, env.Client.SubResource("scale").Get(ctx, pool, scale))
	assert.EqualValues(t, 3, scale.Status.Replicas)
	assert.Equal(t, v1.LabelPool+"=web", scale.Status.Selector)
	scale.Spec.Replicas = 5
	require.NoError(t, env.Client.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)))
	h.waitSteady("web", 5)

	h.update("web", func(p *v1.ProxyPool) {
		p.Spec.Replicas = ptr.To[int32](2)
		p.Spec.Disruption = &v1.Disruption{MaxUnavailable: ptr.To(intstr.FromInt32(3))}
	})
	h.waitSteady("web", 2)
	assert.Equal(t, []string{"web-0", "web-1"}, names(h.members()), "scale-down took the newest (no member held a lease)")

	// Attributes and template labels change in place: same members.
	h.update("web", func(p *v1.ProxyPool) {
		p.Spec.Template.Spec.Attributes = map[string]string{"geo": "us"}
		p.Spec.Template.Metadata.Labels["tier"] = "gold"
	})
	require.Eventually(t, func() bool {
		for _, px := range h.members() {
			if px.Spec.Attributes["geo"] != "us" || px.Labels["tier"] != "gold" {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond)
	h.waitSteady("web", 2)
	assert.Equal(t, []string{"web-0", "web-1"}, names(h.members()), "no member was replaced")

	h.waitEvent("web", v1.EventMemberCreated, "created 3 members")
	h.waitEvent("web", v1.EventMemberDraining, "the pool is scaled down")
	h.waitEvent("web", v1.EventMemberDeleted, "it holds no live lease")
}

// watchMembers samples the namespace's Proxies until the test ends and
// calls check with them.
func watchMembers(t *testing.T, h *harness, check func([]v1.Proxy)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			list := &v1.ProxyList{}
			if err := env.Client.List(ctx, list, client.InNamespace(h.ns)); err == nil {
				check(list.Items)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	stop = func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return stop
}

func active(px *v1.Proxy) bool {
	_, draining := px.Annotations[v1.AnnotationDrainDeadline]
	return px.DeletionTimestamp.IsZero() && !draining
}

// A template change rolls through the pool make-before-break: never more
// than replicas+maxSurge members taking leases, never fewer than replicas
// of them healthy.
func TestARolloutIsMakeBeforeBreak(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.pool("roll", 3))
	before := h.waitSteady("roll", 3)
	var old []string
	for _, px := range h.members() {
		old = append(old, string(px.UID))
	}

	var most, fewestHealthy atomic.Int32
	fewestHealthy.Store(3)
	stop := watchMembers(t, h, func(ps []v1.Proxy) {
		var n, healthy int32
		for i := range ps {
			if active(&ps[i]) {
				n++
				if ps[i].Status.Healthy {
					healthy++
				}
			}
		}
		if n > most.Load() {
			most.Store(n)
		}
		if healthy < fewestHealthy.Load() {
			fewestHealthy.Store(healthy)
		}
	})
	h.update("roll", func(p *v1.ProxyPool) { p.Spec.Template.Spec.Port = 3129 })
	after := h.waitSteady("roll", 3)
	stop()

	assert.NotEqual(t, before.Generation, after.Generation)
	for _, px := range h.members() {
		assert.EqualValues(t, 3129, px.Spec.Port)
		assert.NotContains(t, old, string(px.UID), "every member was replaced")
	}
	assert.LessOrEqual(t, most.Load(), int32(4), "one replacement at a time (maxSurge 1)")
	assert.EqualValues(t, 3, fewestHealthy.Load(), "healthy members never dropped below replicas (maxUnavailable 0)")
}

// A draining member keeps its live leases: it is deleted once they end,
// or when the drain times out.
func TestADrainWaitsForLeases(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.pool("drain", 2))
	h.waitSteady("drain", 2)
	h.leases.set(h.ns+"/drain-0", 1)
	h.leases.set(h.ns+"/drain-1", 2)

	h.update("drain", func(p *v1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](1) })
	var px *v1.Proxy
	require.Eventually(t, func() bool {
		var err error
		px, err = h.proxy("drain-1")
		_, ok := px.Annotations[v1.AnnotationDrainDeadline]
		return err == nil && ok
	}, 30*time.Second, 20*time.Millisecond, "the newest of two leased members drains")
	deadline, err := time.Parse(time.RFC3339, px.Annotations[v1.AnnotationDrainDeadline])
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(10*time.Minute), deadline, 30*time.Second, "the default drain timeout")
	require.Eventually(t, func() bool { return h.get("drain").Status.DrainingReplicas == 1 }, 10*time.Second, 20*time.Millisecond,
		"the pool counts the draining member")

	require.Never(t, func() bool { _, err := h.proxy("drain-1"); return gone(err) }, 2*time.Second, 50*time.Millisecond,
		"a member with live leases stays")
	h.leases.set(h.ns+"/drain-1", 0)
	require.Eventually(t, func() bool { _, err := h.proxy("drain-1"); return gone(err) }, 30*time.Second, 20*time.Millisecond,
		"deleted once its leases ended")
	h.waitSteady("drain", 1)

	// A drain that times out ends with the lease still held.
	h.update("drain", func(p *v1.ProxyPool) {
		p.Spec.Replicas = ptr.To[int32](0)
		p.Spec.DrainTimeout = &metav1.Duration{Duration: 2 * time.Second}
	})
	start := time.Now()
	require.Eventually(t, func() bool { _, err := h.proxy("drain-0"); return gone(err) }, 30*time.Second, 20*time.Millisecond)
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "the leased member waited for its drain timeout")
}

// A do-not-disrupt member is never chosen; the pool says why it cannot
// finish.
func TestDoNotDisruptIsNeverChosen(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.pool("keep", 2))
	h.waitSteady("keep", 2)
	px, err := h.proxy("keep-1")
	require.NoError(t, err)
	px.Annotations = map[string]string{v1.AnnotationDoNotDisrupt: "true"}
	require.NoError(t, env.Client.Update(context.Background(), px))

	h.update("keep", func(p *v1.ProxyPool) { p.Spec.Template.Spec.Port = 3130 })
	require.Eventually(t, func() bool {
		c := h.get("keep").Status.Conditions
		for _, cond := range c {
			if cond.Type == v1.ConditionReady && cond.Reason == v1.ReasonDisruptionBlocked {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		p, err := h.proxy("keep-0")
		return gone(err) || (err == nil && !p.DeletionTimestamp.IsZero())
	}, 30*time.Second, 50*time.Millisecond, "the other member was replaced")
	px, err = h.proxy("keep-1")
	require.NoError(t, err)
	assert.EqualValues(t, 3128, px.Spec.Port, "the do-not-disrupt member stayed")
	_, draining := px.Annotations[v1.AnnotationDrainDeadline]
	assert.False(t, draining)
}

// killingClient stops the manager right after every n-th write of the
// pool reconciler has reached the API server, as a controller killed
// between two steps.
type killingClient struct {
	client.Client
	n, writes int
	kill      func()
	mu        sync.Mutex
}

func (k *killingClient) wrote(err error) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err == nil {
		k.writes++
		if k.writes%k.n == 0 {
			k.kill()
		}
	}
	return err
}

func (k *killingClient) Create(ctx context.Context, o client.Object, opts ...client.CreateOption) error {
	return k.wrote(k.Client.Create(ctx, o, opts...))
}

func (k *killingClient) Patch(ctx context.Context, o client.Object, p client.Patch, opts ...client.PatchOption) error {
	return k.wrote(k.Client.Patch(ctx, o, p, opts...))
}

func (k *killingClient) Delete(ctx context.Context, o client.Object, opts ...client.DeleteOption) error {
	return k.wrote(k.Client.Delete(ctx, o, opts...))
}

// Killed after every few writes, through a scale-up, a rollout and a
// scale-down, restarted controllers never hold more than replicas+maxSurge
// members taking leases, never leave a member unowned, and converge.
func TestManagerStoppedBetweenStepsNeverOverfills(t *testing.T) {
	for _, every := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("killed after every %d writes", every), func(t *testing.T) {
			h := newHarness(t)
			var kills atomic.Int32
			h.wrap = func(c client.Client, kill func()) client.Client {
				return &killingClient{Client: c, n: every, kill: func() { kills.Add(1); kill() }}
			}
			h.start()
			var most atomic.Int32
			var unowned atomic.Value
			watchMembers(t, h, func(ps []v1.Proxy) {
				var n int32
				for i := range ps {
					if metav1.GetControllerOf(&ps[i]) == nil {
						unowned.Store(ps[i].Name)
					}
					if active(&ps[i]) {
						n++
					}
				}
				if n > most.Load() {
					most.Store(n)
				}
			})
			// Restart whenever the manager was killed, until the test ends.
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			wg.Go(func() {
				for {
					select {
					case <-ctx.Done():
						return
					case <-h.done:
						h.start()
					}
				}
			})
			defer func() { cancel(); wg.Wait() }()

			h.create(h.pool("crash", 4))
			h.waitSteady("crash", 4)
			h.update("crash", func(p *v1.ProxyPool) { p.Spec.Template.Spec.Port = 3129 })
			h.waitSteady("crash", 4)
			h.update("crash", func(p *v1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](2) })
			h.waitSteady("crash", 2)

			assert.Greater(t, kills.Load(), int32(3), "the controller was killed along the way")
			assert.LessOrEqual(t, most.Load(), int32(5), "never more than replicas+maxSurge members taking leases")
			assert.Nil(t, unowned.Load(), "never a member without its pool")
		})
	}
}
