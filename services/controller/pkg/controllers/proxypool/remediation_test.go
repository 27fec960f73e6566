package proxypool_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

func seconds(n int) *metav1.Duration {
	return &metav1.Duration{Duration: time.Duration(n) * time.Second}
}

// An unhealthy member is replaced make-before-break; when more members
// are unhealthy than maxUnhealthy, none is, and the pool says why.
func TestUnhealthyMembersAreReplacedUnlessTooMany(t *testing.T) {
	h := newHarness(t).start()
	p := h.pool("heal", 3)
	p.Spec.Remediation = &v1.Remediation{UnhealthyTimeout: seconds(1), MaxUnhealthy: ptr.To(intstr.FromInt32(1))}
	h.create(p)
	h.waitSteady("heal", 3)
	sick, err := h.proxy("heal-1")
	require.NoError(t, err)

	h.setSick("heal-1")
	require.Eventually(t, func() bool {
		px, err := h.proxy("heal-1")
		return gone(err) || px.UID != sick.UID
	}, 30*time.Second, 50*time.Millisecond, "the unhealthy member was replaced")
	h.waitSteady("heal", 3)
	h.waitEvent("heal", v1.EventMemberCreated, "replaces heal-1: it has been unhealthy for more than 1s")

	// A fault of the whole fleet: every member unhealthy at once.
	var all []string
	for _, px := range h.members() {
		all = append(all, px.Name)
	}
	h.setSick(all...)
	require.Eventually(t, func() bool {
		c := h.condition("heal", v1.ConditionRemediationPaused)
		return c.Status == metav1.ConditionTrue && c.Reason == v1.ReasonTooManyUnhealthy
	}, 30*time.Second, 50*time.Millisecond)
	assert.Contains(t, h.condition("heal", v1.ConditionRemediationPaused).Message, "3 of 3 members are unhealthy, more than maxUnhealthy (1)")
	h.waitEvent("heal", v1.ReasonTooManyUnhealthy, "remediation paused")
	require.Never(t, func() bool {
		for _, px := range h.members() {
			if _, draining := px.Annotations[v1.AnnotationDrainDeadline]; draining {
				return true
			}
		}
		return len(h.members()) != 3
	}, 2*time.Second, 50*time.Millisecond, "nothing is replaced while remediation is paused")

	h.setSick()
	require.Eventually(t, func() bool {
		return h.condition("heal", v1.ConditionRemediationPaused).Status == metav1.ConditionFalse
	}, 30*time.Second, 50*time.Millisecond, "the pause ends with the fault")
}

// A slot whose members never come up is retried with backoff, then given
// up: the pool stops creating and says why.
func TestAFailingSlotBacksOffAndGivesUp(t *testing.T) {
	h := newHarness(t)
	h.fake.CreateErr = func(*providers.CreateRequest) error {
		return providers.NewQuota(assert.AnError)
	}
	h.start()
	p := h.pool("bad", 1)
	p.Spec.Template.Spec.Provider = "fake"
	p.Spec.Remediation = &v1.Remediation{StartupTimeout: seconds(1), RetryBackoff: seconds(1), MaxRetries: ptr.To[int32](2)}
	start := time.Now()
	h.create(p)
	require.Eventually(t, func() bool {
		return h.condition("bad", v1.ConditionReady).Reason == v1.ReasonRetriesExhausted
	}, 60*time.Second, 50*time.Millisecond)
	// Three members, each given 1 s to start, and the second retry a
	// backoff of 1 s: about 4 s, less up to a second per member because
	// creation times are whole seconds.
	assert.GreaterOrEqual(t, time.Since(start), 2*time.Second, "the retries backed off")
	assert.Contains(t, h.condition("bad", v1.ConditionReady).Message, "it was not Ready 1s after its creation, and its slot was replaced 2 times already")
	// The member before it may still be draining (no lease, so for the
	// mark lag only).
	var ms []v1.Proxy
	require.Eventually(t, func() bool { ms = h.members(); return len(ms) == 1 }, 30*time.Second, 50*time.Millisecond,
		"the member that failed last stays, alone")
	assert.Equal(t, "2", ms[0].Annotations[v1.AnnotationSlotRetries])
	created := h.fake.Calls("Create")
	require.Never(t, func() bool { now := h.members(); return len(now) != 1 || now[0].UID != ms[0].UID }, 2*time.Second, 50*time.Millisecond,
		"no member is created once the slot gave up")
	assert.Greater(t, h.fake.Calls("Create"), created, "the lifecycle still retries the stuck member's own create")
	h.waitEvent("bad", v1.ReasonRetriesExhausted, "gave up replacing")
}

// maxAge rotates every member, make-before-break.
func TestMaxAgeRotatesMembers(t *testing.T) {
	h := newHarness(t).start()
	p := h.pool("old", 2)
	h.create(p)
	h.waitSteady("old", 2)
	var first []string
	for _, px := range h.members() {
		first = append(first, string(px.UID))
	}
	h.update("old", func(p *v1.ProxyPool) { p.Spec.MaxAge = seconds(3) })
	require.Eventually(t, func() bool {
		for _, px := range h.members() {
			for _, u := range first {
				if string(px.UID) == u {
					return false
				}
			}
		}
		return true
	}, 60*time.Second, 50*time.Millisecond, "both members were rotated")
	h.waitEvent("old", v1.EventMemberCreated, "it reached the pool's maxAge")
	// A 3 s maxAge keeps rotating; without it the pool settles.
	h.update("old", func(p *v1.ProxyPool) { p.Spec.MaxAge = nil })
	h.waitSteady("old", 2)
}

// rolloutAfter rotates every member made before it once, make-before-break,
// and the pool settles: the replacements are made after it.
func TestRolloutAfterRotatesMembersOnce(t *testing.T) {
	h := newHarness(t).start()
	p := h.pool("rot", 2)
	h.create(p)
	h.waitSteady("rot", 2)
	first := map[types.UID]bool{}
	for _, px := range h.members() {
		first[px.UID] = true
	}
	h.update("rot", func(p *v1.ProxyPool) {
		p.Spec.RolloutAfter = &metav1.Time{Time: time.Now().Truncate(time.Second).Add(time.Second)}
	})
	require.Eventually(t, func() bool {
		ms := h.members()
		for _, px := range ms {
			if first[px.UID] {
				return false
			}
		}
		return len(ms) == 2
	}, 60*time.Second, 50*time.Millisecond, "both members were rotated")
	h.waitEvent("rot", v1.EventMemberCreated, "made before the pool's rolloutAfter")
	h.waitSteady("rot", 2)
	second := h.members()
	require.Never(t, func() bool {
		ms := h.members()
		return len(ms) != 2 || ms[0].UID != second[0].UID || ms[1].UID != second[1].UID
	}, 2*time.Second, 100*time.Millisecond, "the replacements stay")
}

// Two members with one egress IP: the newer is replaced.
func TestDistinctEgressIPs(t *testing.T) {
	h := newHarness(t)
	h.egress = func(name string) string {
		if name == "ip-0" || name == "ip-1" {
			return "198.51.100.7"
		}
		return "198.51.100.8"
	}
	h.start()
	p := h.pool("ip", 2)
	p.Spec.DistinctEgressIPs = true
	h.create(p)
	require.Eventually(t, func() bool {
		_, err := h.proxy("ip-2")
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "a replacement for the newer of the two")
	require.Eventually(t, func() bool {
		px, err := h.proxy("ip-1")
		return gone(err) || !px.DeletionTimestamp.IsZero()
	}, 30*time.Second, 50*time.Millisecond, "the newer of the two goes")
	_, err := h.proxy("ip-0")
	assert.NoError(t, err, "the older stays")
}
