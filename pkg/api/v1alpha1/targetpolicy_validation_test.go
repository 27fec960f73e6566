package v1alpha1_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

func targetPolicy(ns string) *v1.TargetPolicy {
	return &v1.TargetPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "tp"}, Spec: v1.TargetPolicySpec{Targets: []string{"shop.example"}}}
}

func duration(d time.Duration) *metav1.Duration { return &metav1.Duration{Duration: d} }

func TestAValidTargetPolicyIsAccepted(t *testing.T) {
	testenv.Require(t)
	p := targetPolicy(env.Namespace(t, "tpol"))
	p.Spec = v1.TargetPolicySpec{
		Targets:             []string{"shop.example", "*.shop.example", "xn--bcher-kva.example"},
		Cooldown:            &v1.CooldownPolicy{Base: duration(time.Minute), Max: duration(time.Hour), Window: duration(2 * time.Hour)},
		MaxCoolingFraction:  ptr.To(0.3),
		MaxConcurrentLeases: ptr.To[int32](50),
		Pacing:              &v1.PacingPolicy{Initial: ptr.To(2.0), Min: ptr.To(0.1), Max: ptr.To(10.0)},
	}
	require.NoError(t, env.Client.Create(context.Background(), p))
	var got v1.TargetPolicy
	require.NoError(t, env.Client.Get(context.Background(), types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, &got))
	assert.Equal(t, 0.3, *got.Spec.MaxCoolingFraction, "a fraction round-trips")
	assert.Equal(t, 0.1, *got.Spec.Pacing.Min)
}

func TestInvalidTargetPoliciesAreRejectedNamingTheField(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "tpol-bad")
	for _, tc := range []struct {
		name   string
		mutate func(*v1.TargetPolicy)
		want   string
	}{
		{"no targets", func(p *v1.TargetPolicy) { p.Spec.Targets = nil }, "spec.targets"},
		{"upper case", func(p *v1.TargetPolicy) { p.Spec.Targets = []string{"Shop.example"} }, "spec.targets[0]"},
		{"wildcard inside", func(p *v1.TargetPolicy) { p.Spec.Targets = []string{"shop.*.example"} }, "spec.targets[0]"},
		{"bare wildcard", func(p *v1.TargetPolicy) { p.Spec.Targets = []string{"*"} }, "spec.targets[0]"},
		{"a URL, not a host", func(p *v1.TargetPolicy) { p.Spec.Targets = []string{"https://shop.example/"} }, "spec.targets[0]"},
		{"too long", func(p *v1.TargetPolicy) { p.Spec.Targets = []string{strings.Repeat("a.", 127) + "example"} }, "spec.targets[0]"},
		{"twice", func(p *v1.TargetPolicy) { p.Spec.Targets = []string{"a.example", "a.example"} }, "spec.targets[1]"},
		{"fraction 0", func(p *v1.TargetPolicy) { p.Spec.MaxCoolingFraction = ptr.To(0.0) }, "spec.maxCoolingFraction"},
		{"fraction above 1", func(p *v1.TargetPolicy) { p.Spec.MaxCoolingFraction = ptr.To(1.5) }, "spec.maxCoolingFraction"},
		{"cap 0", func(p *v1.TargetPolicy) { p.Spec.MaxConcurrentLeases = ptr.To[int32](0) }, "spec.maxConcurrentLeases"},
		{"base above max", func(p *v1.TargetPolicy) {
			p.Spec.Cooldown = &v1.CooldownPolicy{Base: duration(time.Hour), Max: duration(time.Minute)}
		}, "spec.cooldown.base must not be above spec.cooldown.max"},
		{"base under a second", func(p *v1.TargetPolicy) {
			p.Spec.Cooldown = &v1.CooldownPolicy{Base: duration(500 * time.Millisecond)}
		}, "spec.cooldown.base must be at least 1s"},
		{"window of a year", func(p *v1.TargetPolicy) {
			p.Spec.Cooldown = &v1.CooldownPolicy{Window: duration(365 * 24 * time.Hour)}
		}, "spec.cooldown.window must be between 1s and 168h"},
		{"pacing min above initial", func(p *v1.TargetPolicy) {
			p.Spec.Pacing = &v1.PacingPolicy{Initial: ptr.To(1.0), Min: ptr.To(2.0)}
		}, "spec.pacing.min must not be above spec.pacing.initial"},
		{"pacing initial above max", func(p *v1.TargetPolicy) {
			p.Spec.Pacing = &v1.PacingPolicy{Initial: ptr.To(5.0), Max: ptr.To(2.0)}
		}, "spec.pacing.initial must not be above spec.pacing.max"},
		{"pacing rate 0", func(p *v1.TargetPolicy) { p.Spec.Pacing = &v1.PacingPolicy{Min: ptr.To(0.0)} }, "spec.pacing.min"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := targetPolicy(ns)
			tc.mutate(p)
			rejected(t, p, tc.want)
		})
	}

	// A duration string the API cannot parse is refused by its pattern,
	// not by a CEL evaluation error.
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "crawl.example.com/v1alpha1", "kind": "TargetPolicy",
		"metadata": map[string]any{"namespace": ns, "name": "raw"},
		"spec":     map[string]any{"targets": []any{"a.example"}, "cooldown": map[string]any{"base": "soon"}}}}
	err := env.Client.Create(context.Background(), u)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.cooldown.base")
}
