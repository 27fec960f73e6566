package policy_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

var defaults = policy.Target{Policy: store.Policy{CooldownBase: 15 * time.Minute, CooldownMax: 4 * time.Hour, CooldownWindow: time.Hour,
	MaxCoolingFraction: 0.5, PacingInitial: 1, PacingMin: 0.1, PacingMax: 20}}

func tp(name string, age time.Duration, targets []string, capacity int32) v1.TargetPolicy {
	return v1.TargetPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, CreationTimestamp: metav1.NewTime(time.Unix(1e9, 0).Add(-age))},
		Spec:       v1.TargetPolicySpec{Targets: targets, MaxConcurrentLeases: ptr.To(capacity)},
	}
}

func TestTheMostSpecificMatchWins(t *testing.T) {
	p := &policy.Policies{Defaults: defaults}
	p.Set([]v1.TargetPolicy{
		tp("any-example", time.Hour, []string{"*.example"}, 1),
		tp("shops", time.Hour, []string{"*.shop.example"}, 2),
		tp("exact", time.Hour, []string{"shop.example", "vip.shop.example"}, 3),
		tp("newer", time.Minute, []string{"vip.shop.example"}, 4),
		tp("b-same-age", time.Hour, []string{"*.tie.example"}, 5),
		tp("a-same-age", time.Hour, []string{"*.tie.example"}, 6),
	})
	for _, tc := range []struct {
		target string
		source string
		cap    int
	}{
		{"shop.example", "ns/exact", 3},
		{"vip.shop.example", "ns/exact", 3},    // the older of two exact claims
		{"eu.shop.example", "ns/shops", 2},     // the longer wildcard
		{"a.b.shop.example", "ns/shops", 2},    // a wildcard covers every depth
		{"other.example", "ns/any-example", 1}, // the shorter wildcard
		{"example", "", 0},                     // "*.example" does not match example itself
		{"x.tie.example", "ns/a-same-age", 6},  // equal age: namespace/name order
		{"unrelated.test", "", 0},              // the flags
		{"", "", 0},                            // no target
		{"shop.example.evil.test", "", 0},      // suffixes, not substrings
	} {
		got := p.For(tc.target)
		assert.Equal(t, tc.source, got.Source, tc.target)
		assert.Equal(t, tc.cap, got.MaxConcurrentLeases, tc.target)
	}
}

func TestAPolicyOverridesOnlyTheFieldsItSets(t *testing.T) {
	p := &policy.Policies{Defaults: defaults}
	assert.True(t, p.Synced(), "without a watch the defaults are all there is")
	partial := v1.TargetPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "partial"}, Spec: v1.TargetPolicySpec{
		Targets:  []string{"slow.example"},
		Cooldown: &v1.CooldownPolicy{Base: &metav1.Duration{Duration: 5 * time.Hour}},
		// Below the flags' initial and min: both follow it down.
		Pacing: &v1.PacingPolicy{Max: ptr.To(0.05)},
	}}
	p.Set([]v1.TargetPolicy{partial})
	got := p.For("slow.example")
	assert.Equal(t, 5*time.Hour, got.CooldownBase)
	assert.Equal(t, 5*time.Hour, got.CooldownMax, "the flags' max is raised to the policy's base")
	assert.Equal(t, time.Hour, got.CooldownWindow)
	assert.Equal(t, 0.5, got.MaxCoolingFraction)
	assert.Equal(t, 0.05, got.PacingMax)
	assert.Equal(t, 0.05, got.PacingMin)
	assert.Equal(t, 0.05, got.PacingInitial)
	assert.Equal(t, defaults, p.For("fast.example"))
}
