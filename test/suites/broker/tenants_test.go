package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
	"github.com/egress-proxies/egress-proxies/test/framework"
)

// tenantFleet is a broker serving two tenants, each with a Squid proxy in
// a namespace of its own, declared by Tenant objects in a third.
type tenantFleet struct {
	t          *testing.T
	b          *broker
	gw         string
	tenants    string            // the Tenants' namespace
	ns         map[string]string // tenant -> its proxies' namespace
	tokens     map[string]string // tenant -> its token
	squid      map[string]*proc.Squid
	echo       *httptest.Server
	redis      *proc.Redis
	kubeconfig string
}

func newTenantFleet(t *testing.T) *tenantFleet {
	testenv.Require(t)
	f := &tenantFleet{t: t, tenants: env.Namespace(t, "tenants"), ns: map[string]string{}, tokens: map[string]string{}, squid: map[string]*proc.Squid{}}
	f.echo = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, ip)
	}))
	t.Cleanup(f.echo.Close)
	for i, name := range []string{"team-a", "team-b"} {
		f.ns[name] = env.Namespace(t, name)
		f.squid[name] = squidProxy(t, f.ns[name], "p", fmt.Sprintf("127.0.8.%d", 11+i), map[string]string{"pool": "shared"})
		f.tokens[name] = "token-of-" + name
		f.secret(name+"-v1", f.tokens[name])
	}
	f.tenant("team-a", v1.TenantSpec{Namespaces: []string{f.ns["team-a"]},
		Verbs: []v1.TenantVerb{v1.VerbList, v1.VerbWatch, v1.VerbLease, v1.VerbReport, v1.VerbGateway}})
	f.tenant("team-b", v1.TenantSpec{Namespaces: []string{f.ns["team-b"]},
		Verbs:  []v1.TenantVerb{v1.VerbList, v1.VerbLease, v1.VerbGateway},
		Quotas: v1.TenantQuotas{MaxLeases: ptr.To[int32](2), MaxSelectors: ptr.To[int32](2), GatewayBytesPerDay: ptr.To(resource.MustParse("1Ki"))}})

	kc, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	f.kubeconfig, f.redis, f.gw = kc, proc.StartRedis(t, false), proc.Addr(proc.FreePort(t))
	f.b = framework.StartBroker(t, env, "", f.redis, "--tenant-namespace", f.tenants, "--gateway-addr", f.gw, "--egress-allowance-cidrs", proc.SuiteAllowance)
	for name := range f.ns {
		require.Eventually(t, func() bool { return len(f.list(name, "")) == 1 }, 30*time.Second, 50*time.Millisecond, "%s never saw its proxy", name)
	}
	return f
}

func (f *tenantFleet) secret(name, token string) {
	f.t.Helper()
	require.NoError(f.t, env.Client.Create(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.tenants, Name: name},
		StringData: map[string]string{"token": token}}))
}

func (f *tenantFleet) tenant(name string, spec v1.TenantSpec) {
	f.t.Helper()
	spec.Credentials = []v1.TenantCredential{{Name: name + "-v1"}}
	require.NoError(f.t, env.Client.Create(context.Background(), &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: f.tenants, Name: name}, Spec: spec}))
}

func (f *tenantFleet) as(tenant, method, path, body string) rest.Reply {
	f.t.Helper()
	return f.b.Do(method, path, body, "Authorization", "Bearer "+f.tokens[tenant])
}

// list is the ids of the proxies tenant lists.
func (f *tenantFleet) list(tenant, query string) []string {
	f.t.Helper()
	r := f.as(tenant, "GET", "/v1/proxies"+query, "")
	if r.Status != http.StatusOK {
		return nil
	}
	var ids []string
	ps, _ := r.JSON["proxies"].([]any)
	for _, p := range ps {
		ids = append(ids, p.(map[string]any)["id"].(string))
	}
	sort.Strings(ids)
	return ids
}

func refusedFor(t *testing.T, r rest.Reply, reason, message string) {
	t.Helper()
	assert.Equal(t, http.StatusForbidden, r.Status, string(r.Body))
	assert.Contains(t, string(r.Body), reason)
	assert.Contains(t, string(r.Body), message)
}

func (f *tenantFleet) dial(tenant string) *leaseclient.Client {
	f.t.Helper()
	c, err := leaseclient.Dial(f.b.GRPC, leaseclient.WithToken(f.tokens[tenant]))
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Each tenant lists, watches and leases only its own namespaces' proxies,
// is refused another's namespace by name, and cannot touch another's
// lease; request ids collide harmlessly; the verbs it lacks are refused.
func TestTenantsSeeAndLeaseOnlyTheirOwn(t *testing.T) {
	f := newTenantFleet(t)
	a, b := f.ns["team-a"], f.ns["team-b"]
	assert.Equal(t, []string{a + "/p"}, f.list("team-a", ""), "no namespace named: the tenant's own")
	assert.Equal(t, []string{b + "/p"}, f.list("team-b", ""))
	refusedFor(t, f.as("team-a", "GET", "/v1/proxies?namespace="+b, ""), "TENANT_NAMESPACE",
		fmt.Sprintf(`tenant \"team-a\" (Tenant %s/team-a): namespace \"%s\" is outside its namespaces (%s)`, f.tenants, b, a))
	assert.Equal(t, http.StatusUnauthorized, f.b.Do("GET", "/v1/proxies", "").Status, "tenants watched: no credential, no call")

	// The same request id from two tenants: each its own lease, of its own.
	la := f.as("team-a", "POST", "/v1/leases", `{"requestId":"crawl-1","ttlSeconds":60}`)
	lb := f.as("team-b", "POST", "/v1/leases", `{"requestId":"crawl-1","ttlSeconds":60}`)
	require.Equal(t, http.StatusOK, la.Status, string(la.Body))
	require.Equal(t, http.StatusOK, lb.Status, string(lb.Body))
	idA, idB := la.JSON["leaseID"].(string), lb.JSON["leaseID"].(string)
	assert.NotEqual(t, idA, idB)
	assert.Equal(t, a+"/p", la.JSON["proxy"].(map[string]any)["id"])
	assert.Equal(t, b+"/p", lb.JSON["proxy"].(map[string]any)["id"])
	again := f.as("team-a", "POST", "/v1/leases", `{"requestId":"crawl-1","ttlSeconds":60}`)
	assert.Equal(t, idA, again.JSON["leaseID"], "a retry is still answered with its own tenant's lease")
	refusedFor(t, f.as("team-a", "POST", "/v1/leases", `{"namespace":"`+b+`","ttlSeconds":60}`), "TENANT_NAMESPACE", "is outside its namespaces")

	// Another tenant's lease: neither renewed, reported on nor released.
	refusedFor(t, f.as("team-b", "POST", "/v1/leases/"+idA+"/renew", `{"ttlSeconds":60}`), "TENANT_LEASE", "lease "+idA+" is another tenant's")
	refusedFor(t, f.as("team-b", "DELETE", "/v1/leases/"+idA, ""), "TENANT_LEASE", "is another tenant's")
	refusedFor(t, f.as("team-a", "POST", "/v1/leases/"+idB+"/report", `{"result":"blocked","target":"shop.example"}`), "TENANT_LEASE", "is another tenant's")
	refusedFor(t, f.as("team-b", "POST", "/v1/leases/"+idB+"/report", `{"result":"ok"}`), "TENANT_VERB", `may not report (its verbs: gateway, lease, list)`)
	assert.Equal(t, 1, int(f.as("team-a", "GET", "/v1/proxies", "").JSON["proxies"].([]any)[0].(map[string]any)["leaseCount"].(float64)), "team-a's lease lives on")
	for tenant, id := range map[string]string{"team-a": idA, "team-b": idB} {
		r := f.as(tenant, "DELETE", "/v1/leases/"+id, "")
		assert.Equal(t, http.StatusNoContent, r.Status, string(r.Body))
	}

	// The watch: its own proxies only; another namespace refused; a
	// tenant without the verb refused.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := f.dial("team-a").API().WatchProxies(ctx, &leasev1.WatchProxiesRequest{})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	var seen []string
	for _, e := range first.GetEvents() {
		seen = append(seen, e.GetProxy().GetId())
	}
	assert.Equal(t, []string{a + "/p"}, seen)
	other, err := f.dial("team-a").API().WatchProxies(ctx, &leasev1.WatchProxiesRequest{Namespace: b})
	require.NoError(t, err)
	_, err = other.Recv()
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	none, err := f.dial("team-b").API().WatchProxies(ctx, &leasev1.WatchProxiesRequest{})
	require.NoError(t, err)
	_, err = none.Recv()
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "may not watch")

	// Quotas: team-b's two leases, then two selectors.
	for range 2 {
		require.Equal(t, http.StatusOK, f.as("team-b", "POST", "/v1/leases", `{"ttlSeconds":60}`).Status)
	}
	capped := f.as("team-b", "POST", "/v1/leases", `{"ttlSeconds":60}`)
	assert.Equal(t, http.StatusTooManyRequests, capped.Status, string(capped.Body))
	assert.Contains(t, string(capped.Body), `holds 2 live leases, its cap of 2: release some first (its Tenant's spec.quotas.maxLeases)`)
	assert.Equal(t, http.StatusOK, f.as("team-a", "POST", "/v1/leases", `{"ttlSeconds":60}`).Status, "team-b's cap is not team-a's")

	// team-b's selector budget (2): the plain selector it used and one
	// more; a third new one is refused, one it has is not, and team-a's
	// budget is its own.
	assert.Equal(t, "TOKEN_LEASE_CAP", reason(f.as("team-b", "POST", "/v1/leases", `{"selector":{"pool":"shared"},"ttlSeconds":60}`)))
	over := f.as("team-b", "POST", "/v1/leases", `{"selector":{"geo":"x"},"ttlSeconds":60}`)
	assert.Equal(t, "TENANT_SELECTOR_BUDGET", reason(over), string(over.Body))
	assert.Contains(t, string(over.Body), `leases with 2 distinct selectors on this broker, its budget (its Tenant's spec.quotas.maxSelectors)`)
	assert.Equal(t, "TOKEN_LEASE_CAP", reason(f.as("team-b", "POST", "/v1/leases", `{"selector":{"pool":"shared"},"ttlSeconds":60}`)))
	assert.Equal(t, "NO_MATCHING_PROXY", reason(f.as("team-a", "POST", "/v1/leases", `{"selector":{"geo":"x"},"ttlSeconds":60}`)))

	// Each tenant's usage, by name.
	m := f.b.Metrics()
	assert.Equal(t, 2.0, m[`proxy_operator_broker_tenant_live_leases{tenant="team-b"}`])
	assert.Equal(t, 1.0, m[`proxy_operator_broker_tenant_live_leases{tenant="team-a"}`])
	assert.Equal(t, 3.0, m[`proxy_operator_broker_tenant_refusals_total{reason="TOKEN_LEASE_CAP",tenant="team-b"}`])
	assert.Equal(t, 2.0, m[`proxy_operator_broker_tenant_refusals_total{reason="TENANT_NAMESPACE",tenant="team-a"}`], "the list and the lease")
	assert.Equal(t, 2.0, m[`proxy_operator_broker_tenant_refusals_total{reason="TENANT_LEASE",tenant="team-b"}`])
	assert.Equal(t, 1.0, m[`proxy_operator_broker_tenant_refusals_total{reason="TENANT_SELECTOR_BUDGET",tenant="team-b"}`])
	assert.Equal(t, 2.0, m[`proxy_operator_broker_tenant_refusals_total{reason="TENANT_VERB",tenant="team-b"}`], "the report and the watch")
}

// The gateway leases from the tenant's own namespaces when its user
// names none, refuses another's namespace, and ends the tunnels of a
// credential removed from its Tenant; the tenant's rotated-in credential
// keeps working throughout.
func TestTenantsThroughTheGateway(t *testing.T) {
	f := newTenantFleet(t)
	pool := f.echo.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	via := func(user, token string) *http.Client {
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: pool},
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(user, token), Host: f.gw})}}
	}
	// works says whether a tunnel with token reaches the site (a refused
	// CONNECT is an error to Go's client).
	works := func(token string) bool {
		resp, err := via("", token).Get(f.echo.URL)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	// team-b's tunnels may carry 1 KiB a day: its first tunnel passes it.
	tunnels := map[string]int{"team-a": 4, "team-b": 1}
	for tenant, sq := range f.squid {
		for range tunnels[tenant] {
			code, body, _ := get(t, via("", f.tokens[tenant]), f.echo.URL)
			require.Equal(t, http.StatusOK, code, body)
			assert.Equal(t, sq.Host, body, "%s was served by its own proxy", tenant)
		}
	}
	for tenant, n := range tunnels {
		// The outcome is reported as the tunnel ends, after the client
		// has its answer.
		require.Eventually(t, func() bool {
			return f.b.Metrics()[`proxy_operator_broker_tenant_outcomes_total{result="ok",tenant="`+tenant+`"}`] == float64(n)
		}, 10*time.Second, 20*time.Millisecond, tenant)
		assert.Positive(t, f.b.Metrics()[`proxy_operator_broker_tenant_gateway_bytes_total{direction="received",tenant="`+tenant+`"}`], tenant)
	}
	var quota *http.Response
	require.Eventually(t, func() bool { // counted as the tunnel ended
		quota = rawTo(t, f.gw, "CONNECT "+hostOf(f.echo.URL)+" HTTP/1.1\r\n"+basic("", f.tokens["team-b"])+"\r\n\r\n")
		return quota.StatusCode != http.StatusOK
	}, 10*time.Second, 50*time.Millisecond)
	body, _ := io.ReadAll(quota.Body)
	assert.Equal(t, http.StatusTooManyRequests, quota.StatusCode, string(body))
	assert.Equal(t, "TENANT_BYTES_QUOTA", quota.Header.Get("X-Egress-Proxies-Reason"))
	assert.Contains(t, string(body), "its quota (its Tenant's spec.quotas.gatewayBytesPerDay 1024); it renews at 00:00 UTC")
	assert.NotEmpty(t, quota.Header.Get("Retry-After"))
	assert.True(t, works(f.tokens["team-a"]), "team-a's bytes are its own")
	resp := rawTo(t, f.gw, "CONNECT "+hostOf(f.echo.URL)+" HTTP/1.1\r\n"+basic("namespace="+f.ns["team-b"], f.tokens["team-a"])+"\r\n\r\n")
	body, _ = io.ReadAll(resp.Body)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode, string(body))
	assert.Equal(t, "TENANT_NAMESPACE", resp.Header.Get("X-Egress-Proxies-Reason"))

	// Rotation: a second credential, a tunnel on each, the first removed;
	// meanwhile a crawler calls the API without pause, moving to the new
	// credential once it works, as a rotation runs: no call is refused.
	var current atomic.Value
	current.Store(f.tokens["team-a"])
	stop, calls := make(chan struct{}), make(chan [2]int, 1)
	go func() {
		n, failed := 0, 0
		for {
			select {
			case <-stop:
				calls <- [2]int{n, failed}
				return
			default:
			}
			if r := f.b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer "+current.Load().(string)); r.Status != http.StatusOK {
				failed++
			}
			n++
		}
	}()
	f.secret("team-a-v2", "second-token-of-team-a")
	var tn v1.Tenant
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.tenants, Name: "team-a"}, &tn))
	tn.Spec.Credentials = append(tn.Spec.Credentials, v1.TenantCredential{Name: "team-a-v2"})
	require.NoError(t, env.Client.Update(context.Background(), &tn))
	require.Eventually(t, func() bool { return works("second-token-of-team-a") }, 15*time.Second, 100*time.Millisecond, "the second credential never worked")
	assert.True(t, works(f.tokens["team-a"]), "both credentials work at once")
	current.Store("second-token-of-team-a")
	oldTunnel, _ := tunnel(t, f.gw, basic("", f.tokens["team-a"]), hostOf(f.echo.URL))
	newTunnel, _ := tunnel(t, f.gw, basic("", "second-token-of-team-a"), hostOf(f.echo.URL))
	tn.Spec.Credentials = tn.Spec.Credentials[1:]
	require.NoError(t, env.Client.Update(context.Background(), &tn))
	require.Eventually(t, func() bool { return !works(f.tokens["team-a"]) }, 15*time.Second, 100*time.Millisecond, "the removed credential still works")
	resp = rawTo(t, f.gw, "CONNECT "+hostOf(f.echo.URL)+" HTTP/1.1\r\n"+basic("", f.tokens["team-a"])+"\r\n\r\n")
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
	assert.True(t, works("second-token-of-team-a"), "the credential kept works")
	close(stop)
	got := <-calls
	assert.Positive(t, got[0])
	assert.Zero(t, got[1], "of %d calls through the rotation, none was refused", got[0])
	// The removed credential's tunnel ends at its lease's next renewal;
	// the kept one's lives.
	require.NoError(t, oldTunnel.SetReadDeadline(time.Now().Add(30*time.Second)))
	_, err := oldTunnel.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the removed credential's tunnel was ended")
	require.Eventually(t, func() bool {
		return f.b.Metrics()[`proxy_operator_broker_tenant_live_leases{tenant="team-a"}`] == 1
	}, 10*time.Second, 20*time.Millisecond, "the ended tunnel's lease was released, though its credential is gone")
	require.NoError(t, newTunnel.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, err = newTunnel.Read(make([]byte, 1))
	var ne net.Error
	assert.True(t, errors.As(err, &ne) && ne.Timeout(), "the kept credential's tunnel lives: %v", err)
}

// Reports weigh per tenant on a real broker: an untrusted tenant's block
// cools its proxy for itself alone (its list shows the cooldown, another
// tenant's does not and leases the proxy); a second tenant's block on
// the same exit cools it for everyone; a trusted tenant's does at once.
func TestTenantsReportsWeighForThemselves(t *testing.T) {
	f := newTenantFleet(t)
	a, b := f.ns["team-a"], f.ns["team-b"]
	for _, name := range []string{"team-c", "ops"} {
		f.tokens[name] = "token-of-" + name
		f.secret(name+"-v1", f.tokens[name])
	}
	// Both namespaces (the suite's other tests have proxies elsewhere).
	f.tenant("team-c", v1.TenantSpec{Namespaces: []string{a, b}})
	f.tenant("ops", v1.TenantSpec{Namespaces: []string{a, b}, Trusted: true})
	for _, name := range []string{"team-c", "ops"} {
		require.Eventually(t, func() bool { return len(f.list(name, "")) == 2 }, 30*time.Second, 50*time.Millisecond, "%s never saw the proxies", name)
	}
	// cooling is whether tenant's list shows the proxy in ns cooling
	// down for shop.example.
	cooling := func(tenant, ns string) bool {
		r := f.as(tenant, "GET", "/v1/proxies?target=shop.example&namespace="+ns, "")
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		return r.JSON["proxies"].([]any)[0].(map[string]any)["cooldownUntil"] != nil
	}
	// block leases ns's proxy for shop.example as tenant, reports it
	// blocked and returns the report's actions.
	block := func(tenant, ns string) []any {
		l := f.as(tenant, "POST", "/v1/leases", `{"namespace":"`+ns+`","target":"shop.example","ttlSeconds":60}`)
		require.Equal(t, http.StatusOK, l.Status, string(l.Body))
		id := l.JSON["leaseID"].(string)
		r := f.as(tenant, "POST", "/v1/leases/"+id+"/report", `{"result":"blocked","target":"shop.example"}`)
		require.Equal(t, http.StatusOK, r.Status, string(r.Body))
		require.Equal(t, http.StatusNoContent, f.as(tenant, "DELETE", "/v1/leases/"+id, "").Status)
		return r.JSON["actions"].([]any)
	}

	assert.Equal(t, []any{"COOLDOWN_STARTED", "TENANT_ONLY"}, block("team-a", a))
	assert.True(t, cooling("team-a", a), "team-a's own view")
	again := f.as("team-a", "POST", "/v1/leases", `{"target":"shop.example","ttlSeconds":60}`)
	assert.Equal(t, "ALL_COOLING_DOWN", reason(again), string(again.Body))
	assert.False(t, cooling("team-c", a), "not team-c's")
	assert.False(t, cooling("ops", a))

	assert.Equal(t, []any{"COOLDOWN_STARTED"}, block("team-c", a), "team-c agrees: the fleet's")
	for _, tenant := range []string{"team-a", "team-c", "ops"} {
		assert.True(t, cooling(tenant, a), tenant)
	}
	assert.Equal(t, []any{"COOLDOWN_STARTED"}, block("ops", b), "a trusted tenant's is the fleet's at once")
	assert.True(t, cooling("team-c", b))
	assert.True(t, cooling("team-b", b))
}

// A watch outlives neither its credential nor its scope: a REST watch
// whose credential Secret is deleted ends (within 10 s: one reread of the
// Secrets, one re-authorisation of the watch; printed) with an
// Unauthenticated error line.
func TestTenantsWatchEndsWithItsCredential(t *testing.T) {
	f := newTenantFleet(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, f.b.REST+"/v1/proxies:watch", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+f.tokens["team-a"])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	require.NoError(t, env.Client.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.tenants, Name: "team-a-v1"}}))
	removed := time.Now()
	var last string
	// 10 s is the promise (a reread, then a re-authorisation); the wait
	// allows a busy machine, and the time taken is printed.
	deadline := time.After(time.Minute)
	for open := true; open; {
		select {
		case l, ok := <-lines:
			if open = ok; ok {
				last = l
			}
		case <-deadline:
			t.Fatal("the watch outlived its credential")
		}
	}
	t.Logf("the watch ended %s after its credential's Secret was deleted", time.Since(removed).Round(100*time.Millisecond))
	assert.Contains(t, last, `"error"`)
	assert.Contains(t, last, "invalid bearer token")
}

// gatewayBytesPerDay counts plain-HTTP bytes, and a tunnel's while it
// flows: plain requests pass the quota and the next is refused; an open
// tunnel downloading far more than its tenant's quota is cut within
// 1 MiB past it, not when it ends.
func TestTenantsGatewayBytesAreCountedAsTheyFlow(t *testing.T) {
	f := newTenantFleet(t)
	const quota = 2 << 20
	for _, name := range []string{"team-c", "team-d"} {
		f.tokens[name] = "token-of-" + name
		f.secret(name+"-v1", f.tokens[name])
		f.tenant(name, v1.TenantSpec{Namespaces: []string{f.ns["team-a"]}, Verbs: []v1.TenantVerb{v1.VerbGateway},
			Quotas: v1.TenantQuotas{GatewayBytesPerDay: ptr.To(*resource.NewQuantity(quota, resource.BinarySI))}})
	}
	serve := func(w http.ResponseWriter, r *http.Request) {
		chunk := bytes.Repeat([]byte("x"), 64<<10)
		for range 64 << 20 / len(chunk) { // 64 MiB, unless cut
			if _, err := w.Write(chunk); err != nil {
				return
			}
			if r.URL.Path == "/small" {
				return
			}
		}
	}
	plain := httptest.NewServer(http.HandlerFunc(serve))
	t.Cleanup(plain.Close)
	tlsSite := httptest.NewTLSServer(http.HandlerFunc(serve))
	t.Cleanup(tlsSite.Close)
	via := func(tenant string) *http.Client {
		return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{RootCAs: tlsSite.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs},
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword("", f.tokens[tenant]), Host: f.gw})}}
	}
	// Plain requests of 64 KiB each: their bytes count, and once the day
	// holds 2 MiB the next is refused.
	var refused *http.Response
	require.Eventually(t, func() bool {
		resp, err := via("team-c").Get(plain.URL + "/small")
		if err != nil {
			return false // the Tenant not read yet
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			refused = resp
			return true
		}
		return false
	}, 60*time.Second, time.Millisecond, "plain requests never reached the quota")
	assert.Equal(t, "TENANT_BYTES_QUOTA", refused.Header.Get("X-Egress-Proxies-Reason"))

	// One tunnel downloading 64 MiB against a quota of 2 MiB is cut.
	var got int64
	require.Eventually(t, func() bool {
		resp, err := via("team-d").Get(tlsSite.URL + "/big")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		got, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusOK
	}, 30*time.Second, 50*time.Millisecond)
	t.Logf("a tunnel with %d bytes of quota left carried %d bytes before it was cut", quota, got)
	assert.Less(t, got, int64(quota+1<<20), "cut within 1 MiB past the quota")
	assert.Greater(t, got, int64(quota/2), "the quota's bytes went through first")
	assert.Eventually(t, func() bool {
		return f.b.Metrics()[`proxy_operator_broker_gateway_tunnel_ends_total{why="quota"}`] >= 1
	}, 10*time.Second, 50*time.Millisecond)
}
