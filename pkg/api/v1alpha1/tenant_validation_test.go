package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

func tenant(ns string) *v1.Tenant {
	return &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team-a"}, Spec: v1.TenantSpec{
		Credentials: []v1.TenantCredential{{Name: "team-a-token"}}, Namespaces: []string{"crawl-a"}}}
}

func TestAValidTenantIsAccepted(t *testing.T) {
	testenv.Require(t)
	p := tenant(env.Namespace(t, "tenant"))
	p.Spec = v1.TenantSpec{
		Credentials: []v1.TenantCredential{{Name: "team-a-v1"}, {Namespace: "crawl-a", Name: "team-a-v2", Key: "password"}},
		Namespaces:  []string{"crawl-a", "crawl-b"},
		Selector:    map[string]string{"pool": "team-a"},
		Verbs:       []v1.TenantVerb{v1.VerbLease, v1.VerbReport, v1.VerbGateway},
		Quotas: v1.TenantQuotas{MaxLeases: ptr.To[int32](500), LeasesPerMinute: ptr.To[int32](6000), ReportsPerSecond: ptr.To[int32](50),
			MaxTunnels: ptr.To[int32](200), MaxWatches: ptr.To[int32](4), MaxSelectors: ptr.To[int32](16)},
		Trusted: true,
	}
	require.NoError(t, env.Client.Create(context.Background(), p))
	every := tenant(p.Namespace)
	every.Name, every.Spec.Namespaces = "root", []string{"*"}
	require.NoError(t, env.Client.Create(context.Background(), every), `"*" alone is every namespace`)
}

func TestInvalidTenantsAreRejectedNamingTheField(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "tenant-bad")
	for _, tc := range []struct {
		name   string
		mutate func(*v1.Tenant)
		want   string
	}{
		{"no credentials", func(p *v1.Tenant) { p.Spec.Credentials = nil }, "spec.credentials"},
		{"three credentials", func(p *v1.Tenant) {
			p.Spec.Credentials = []v1.TenantCredential{{Name: "a"}, {Name: "b"}, {Name: "c"}}
		}, "spec.credentials"},
		{"a credential with no name", func(p *v1.Tenant) { p.Spec.Credentials = []v1.TenantCredential{{Key: "token"}} }, "spec.credentials[0].name"},
		{"a credential's bad namespace", func(p *v1.Tenant) {
			p.Spec.Credentials = []v1.TenantCredential{{Name: "a", Namespace: "Crawl_A"}}
		}, "spec.credentials[0].namespace"},
		{"no namespaces", func(p *v1.Tenant) { p.Spec.Namespaces = nil }, "spec.namespaces"},
		{"a bad namespace", func(p *v1.Tenant) { p.Spec.Namespaces = []string{"crawl/a"} }, "spec.namespaces[0]"},
		{"every namespace and one", func(p *v1.Tenant) { p.Spec.Namespaces = []string{"*", "crawl-a"} }, `"*" (every namespace) must be the only entry`},
		{"a namespace twice", func(p *v1.Tenant) { p.Spec.Namespaces = []string{"a", "a"} }, "spec.namespaces[1]"},
		{"an unknown verb", func(p *v1.Tenant) { p.Spec.Verbs = []v1.TenantVerb{"delete"} }, "spec.verbs[0]"},
		{"a bad selector key", func(p *v1.Tenant) { p.Spec.Selector = map[string]string{"a b": "x"} }, "spec.selector"},
		{"an empty selector value", func(p *v1.Tenant) { p.Spec.Selector = map[string]string{"pool": ""} }, "spec.selector"},
		{"a long selector value", func(p *v1.Tenant) { p.Spec.Selector = map[string]string{"pool": strings.Repeat("a", 64)} }, "spec.selector"},
		{"zero leases", func(p *v1.Tenant) { p.Spec.Quotas.MaxLeases = ptr.To[int32](0) }, "spec.quotas.maxLeases"},
		{"negative tunnels", func(p *v1.Tenant) { p.Spec.Quotas.MaxTunnels = ptr.To[int32](-1) }, "spec.quotas.maxTunnels"},
		{"zero selectors", func(p *v1.Tenant) { p.Spec.Quotas.MaxSelectors = ptr.To[int32](0) }, "spec.quotas.maxSelectors"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tenant(ns)
			tc.mutate(p)
			rejected(t, p, tc.want)
		})
	}
}
