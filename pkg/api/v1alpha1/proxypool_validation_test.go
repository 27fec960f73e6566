package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

func pool(ns, name string) *v1.ProxyPool {
	return &v1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1.ProxyPoolSpec{Template: v1.ProxyTemplate{Spec: v1.ProxyTemplateSpec{Provider: "kubernetes"}}},
	}
}

func TestAValidPoolIsAcceptedWithDefaults(t *testing.T) {
	testenv.Require(t)
	p := pool(env.Namespace(t, "ppool"), "p")
	require.NoError(t, env.Client.Create(context.Background(), p))
	assert.EqualValues(t, 1, *p.Spec.Replicas)
	assert.EqualValues(t, 3128, p.Spec.Template.Spec.Port)
	assert.Equal(t, "10m0s", p.Spec.DrainTimeout.Duration.String())

	a := pool(p.Namespace, "auto")
	a.Spec.Autoscaling = &v1.Autoscaling{MinReplicas: 1, MaxReplicas: 3}
	a.Spec.Remediation = &v1.Remediation{}
	require.NoError(t, env.Client.Create(context.Background(), a))
	assert.EqualValues(t, 5, a.Spec.Autoscaling.TargetLeasesPerProxy)
	assert.Equal(t, "5m0s", a.Spec.Autoscaling.ScaleDownStabilization.Duration.String())
	assert.Equal(t, "15m0s", a.Spec.Remediation.StartupTimeout.Duration.String())
	assert.Equal(t, "10m0s", a.Spec.Remediation.UnhealthyTimeout.Duration.String())
	assert.Equal(t, "40%", a.Spec.Remediation.MaxUnhealthy.String())
	assert.EqualValues(t, 5, *a.Spec.Remediation.MaxRetries)
}

func TestInvalidPoolsAreRejectedNamingTheField(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "ppool-bad")
	for _, tc := range []struct {
		name   string
		mutate func(*v1.ProxyPool)
		want   string
	}{
		{"no provider", func(p *v1.ProxyPool) { p.Spec.Template.Spec.Provider = "" }, "spec.template.spec.provider"},
		{"negative replicas", func(p *v1.ProxyPool) { p.Spec.Replicas = ptr.To[int32](-1) }, "spec.replicas"},
		{"surge and unavailable both 0", func(p *v1.ProxyPool) {
			p.Spec.Strategy = &v1.RolloutStrategy{MaxSurge: ptr.To(intstr.FromInt32(0)), MaxUnavailable: ptr.To(intstr.FromInt32(0))}
		}, "must not both be 0"},
		{"surge not a percentage", func(p *v1.ProxyPool) {
			p.Spec.Strategy = &v1.RolloutStrategy{MaxSurge: ptr.To(intstr.FromString("many"))}
		}, "spec.strategy.maxSurge must be"},
		{"disruption budget 0", func(p *v1.ProxyPool) {
			p.Spec.Disruption = &v1.Disruption{MaxUnavailable: ptr.To(intstr.FromInt32(0))}
		}, "spec.disruption.maxUnavailable must be"},
		{"name too long for its members", func(p *v1.ProxyPool) { p.Name = strings.Repeat("a", 58) }, "at most 57 characters"},
		{"bad attribute key", func(p *v1.ProxyPool) { p.Spec.Template.Spec.Attributes = map[string]string{"-x": "y"} }, "spec.template.spec.attributes keys"},
		{"a template label the pool owns", func(p *v1.ProxyPool) {
			p.Spec.Template.Metadata.Labels = map[string]string{v1.LabelTemplateHash: "x"}
		}, "spec.template.metadata.labels may not use the crawl.example.com/ prefix"},
		{"a template annotation the pool owns", func(p *v1.ProxyPool) {
			p.Spec.Template.Metadata.Annotations = map[string]string{v1.AnnotationDrainDeadline: "2026-12-03T00:00:00Z"}
		}, "spec.template.metadata.annotations may not use the crawl.example.com/ prefix"},
		{"autoscaling min above max", func(p *v1.ProxyPool) {
			p.Spec.Autoscaling = &v1.Autoscaling{MinReplicas: 5, MaxReplicas: 2}
		}, "spec.autoscaling.minReplicas must not be above maxReplicas"},
		{"autoscaling min 0", func(p *v1.ProxyPool) {
			p.Spec.Autoscaling = &v1.Autoscaling{MinReplicas: 0, MaxReplicas: 2}
		}, "spec.autoscaling.minReplicas"},
		{"maxUnhealthy not a percentage", func(p *v1.ProxyPool) {
			p.Spec.Remediation = &v1.Remediation{MaxUnhealthy: ptr.To(intstr.FromString("half"))}
		}, "spec.remediation.maxUnhealthy must be"},
		{"negative retries", func(p *v1.ProxyPool) {
			p.Spec.Remediation = &v1.Remediation{MaxRetries: ptr.To[int32](-1)}
		}, "spec.remediation.maxRetries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := pool(ns, "bad")
			tc.mutate(p)
			rejected(t, p, tc.want)
		})
	}
}

// A status written by merge patch from an empty one leaves its zeros out
// (the diff has nothing to say of them), so the stored counts are
// defaulted: kubectl's HEALTHY and LEASED columns print 0, not nothing.
func TestAPoolsZeroCountsAreStored(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	p := pool(env.Namespace(t, "ppool"), "zeros")
	require.NoError(t, env.Client.Create(ctx, p))
	base := p.DeepCopy()
	p.Status.Replicas, p.Status.Selector = 5, "x=y"
	require.NoError(t, env.Client.Status().Patch(ctx, p, client.MergeFrom(base)))

	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(v1.GroupVersion.WithKind("ProxyPool"))
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(p), u))
	for _, f := range []string{"readyReplicas", "healthyReplicas", "leasedReplicas", "updatedReplicas", "drainingReplicas"} {
		v, found, err := unstructured.NestedInt64(u.Object, "status", f)
		require.NoError(t, err)
		assert.True(t, found, "status.%s is stored", f)
		assert.Zero(t, v)
	}
}
