package access

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

func object(spec v1.TenantSpec) *v1.Tenant {
	return &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: "ep", Name: "team-a"}, Spec: spec}
}

func reason(t *testing.T, err error) string {
	t.Helper()
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.Reason
		}
	}
	return ""
}

// A request is narrowed to its tenant: the one namespace it names, or all
// of the tenant's; the tenant's attributes added; anything outside
// refused, naming the tenant's scope.
func TestScope(t *testing.T) {
	tn := FromObject(object(v1.TenantSpec{Namespaces: []string{"crawl-b", "crawl-a"}, Selector: map[string]string{"pool": "a"}}))
	for _, tc := range []struct {
		name      string
		namespace string
		selector  map[string]string
		wantNS    []string
		wantSel   map[string]string
		denied    string
		message   string
	}{
		{"no namespace: all of its own", "", nil, []string{"crawl-a", "crawl-b"}, map[string]string{"pool": "a"}, "", ""},
		{"one of its own", "crawl-b", map[string]string{"geo": "eu"}, []string{"crawl-b"}, map[string]string{"geo": "eu", "pool": "a"}, "", ""},
		{"its own attribute repeated", "", map[string]string{"pool": "a"}, []string{"crawl-a", "crawl-b"}, map[string]string{"pool": "a"}, "", ""},
		{"another namespace", "crawl-c", nil, nil, nil, "TENANT_NAMESPACE", `namespace "crawl-c" is outside its namespaces (crawl-a, crawl-b)`},
		{"another attribute value", "", map[string]string{"pool": "b"}, nil, nil, "TENANT_SELECTOR", `selector pool="b" is outside its selector (pool=a)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, sel, err := tn.Scope(tc.namespace, tc.selector)
			if tc.denied != "" {
				assert.Equal(t, tc.denied, reason(t, err))
				assert.Contains(t, err.Error(), `tenant "team-a" (Tenant ep/team-a): `+tc.message)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantNS, ns)
			assert.Equal(t, tc.wantSel, sel)
		})
	}
	ns, sel, err := FromObject(object(v1.TenantSpec{Namespaces: []string{"*"}})).Scope("", map[string]string{"geo": "eu"})
	require.NoError(t, err)
	assert.Nil(t, ns, `"*" is every namespace`)
	assert.Equal(t, map[string]string{"geo": "eu"}, sel)
}

// Each method needs its verb; the gateway needs the gateway verb alone;
// a gateway-only credential is told it cannot call the API; a recheck
// finds the credential as it stands now.
func TestVerbs(t *testing.T) {
	reg := &Registry{File: auth.Static("root:root-secret", "gw:gw-secret scope=gateway")}
	reg.snap.Store(&snapshot{creds: []credential{
		{[]byte("lister"), FromObject(object(v1.TenantSpec{Namespaces: []string{"a"}, Verbs: []v1.TenantVerb{v1.VerbList}}))},
		{[]byte("default"), FromObject(object(v1.TenantSpec{Namespaces: []string{"a"}}))},
		{[]byte("gateway"), FromObject(object(v1.TenantSpec{Namespaces: []string{"a"}, Verbs: []v1.TenantVerb{v1.VerbGateway}}))},
	}})
	const viaGateway = "the gateway"
	for _, tc := range []struct {
		name, token, method string
		code                codes.Code
		message             string
	}{
		{"list may list", "lister", leasev1.LeaseService_ListProxies_FullMethodName, codes.OK, ""},
		{"list may not lease", "lister", leasev1.LeaseService_CreateLease_FullMethodName, codes.PermissionDenied, "may not lease (its verbs: list)"},
		{"list may not watch", "lister", leasev1.LeaseService_WatchProxies_FullMethodName, codes.PermissionDenied, "may not watch"},
		{"default verbs report", "default", leasev1.LeaseService_ReportSession_FullMethodName, codes.OK, ""},
		{"default verbs exclude the gateway", "default", viaGateway, codes.PermissionDenied, "may not gateway"},
		{"gateway only at the API", "gateway", leasev1.LeaseService_CreateLease_FullMethodName, codes.PermissionDenied, "for the proxy gateway (verbs: gateway): they cannot lease"},
		{"gateway only through the gateway", "gateway", viaGateway, codes.OK, ""},
		{"a method with no verb", "default", "/egressproxies.lease.v1.LeaseService/DeleteEverything", codes.PermissionDenied, "has no verb"},
		{"another service needs only a credential", "lister", "/grpc.health.v1.Health/Check", codes.OK, ""},
		{"the file's line is everything", "root-secret", leasev1.LeaseService_WatchProxies_FullMethodName, codes.OK, ""},
		{"the file's line may use the gateway", "root-secret", viaGateway, codes.OK, ""},
		{"the file's gateway line", "gw-secret", leasev1.LeaseService_ListProxies_FullMethodName, codes.PermissionDenied, "for the proxy gateway (verbs: gateway, report): they cannot list"},
		{"the file's gateway line reports what its tunnels saw", "gw-secret", leasev1.LeaseService_ReportSession_FullMethodName, codes.OK, ""},
		{"the file's gateway line through the gateway", "gw-secret", viaGateway, codes.OK, ""},
		{"no one's", "guess", leasev1.LeaseService_ListProxies_FullMethodName, codes.Unauthenticated, ""},
		{"no one's at the gateway", "guess", viaGateway, codes.Unauthenticated, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c Caller
			var err error
			if tc.method == viaGateway {
				c, err = reg.Gateway(tc.token)
				assert.Equal(t, err == nil, c.Gateway, "a gateway caller, or none")
			} else {
				var ctx context.Context
				ctx, err = reg.Verify(context.Background(), tc.method, tc.token)
				c = CallerOf(ctx)
			}
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tc.message)
			if err == nil {
				assert.NotEmpty(t, c.Name)
				assert.False(t, reg.Seen()[c.Name].IsZero(), "a call is seen")
				again, err := reg.Recheck(c, List)
				if tc.method == viaGateway || tc.token == "lister" || tc.token == "root-secret" {
					require.NoError(t, err, "a recheck of a gateway caller asks for the gateway verb, whatever it is given")
					assert.Equal(t, c.Name, again.Name)
					assert.Equal(t, c.Gateway, again.Gateway)
				}
			}
		})
	}
	c, err := reg.Gateway("gateway")
	require.NoError(t, err)
	reg.snap.Store(&snapshot{})
	_, err = reg.Recheck(c, Gateway)
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "a removed credential fails its recheck: %v", err)
	printed := Caller{Tenant: &Tenant{Name: "team"}, token: "s3cret-token"}
	assert.NotContains(t, fmt.Sprintf("%v %+v %s", printed, printed, printed), "s3cret", "a caller prints its name, never its token")
	assert.Equal(t, Anonymous, CallerOf(context.Background()), "no credentials configured: the anonymous caller")
}

func TestFromObject(t *testing.T) {
	tn := FromObject(object(v1.TenantSpec{Namespaces: []string{"a"}, Verbs: []v1.TenantVerb{v1.VerbReport, v1.VerbLease}, Trusted: true,
		Quotas: v1.TenantQuotas{MaxLeases: ptr.To[int32](5), MaxTunnels: ptr.To[int32](7)}}))
	assert.Equal(t, []Verb{Lease, Report}, tn.Verbs)
	assert.Equal(t, Quotas{MaxLeases: 5, MaxTunnels: 7}, tn.Quotas)
	assert.True(t, tn.Trusted)
	assert.True(t, tn.Sees("a"))
	assert.False(t, tn.Sees("b"))
	assert.True(t, tn.SeesAll([]string{"a"}))
	assert.False(t, tn.SeesAll(nil), "every namespace is more than its own")
	assert.True(t, Open.SeesAll(nil))
}

func TestScoped(t *testing.T) {
	a := &Tenant{Name: "a"}
	assert.Equal(t, "a/req-1", a.Scoped("req-1"))
	assert.Equal(t, "", a.Scoped(""))
	assert.Equal(t, "req-1", Open.Scoped("req-1"), "no tenant, no scope")
}
