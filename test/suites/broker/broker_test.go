package broker

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
	"github.com/egress-proxies/egress-proxies/test/framework"
)

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// The README's quickstart, request for request, with its JSON field names.
func TestQuickstartOverREST(t *testing.T) {
	f := newFleet(t)
	f.add("proxy-kubernetes-sample", "127.0.0.21", map[string]string{"geo": "local"})
	b := startBroker(t, f, proc.StartRedis(t, false))
	b.WaitListed(1)

	list := b.Do("GET", "/v1/proxies?healthy=true", "")
	require.Equal(t, 200, list.Status, string(list.Body))
	ps := list.JSON["proxies"].([]any)
	require.Len(t, ps, 1)
	p := ps[0].(map[string]any)
	assert.ElementsMatch(t, []string{"id", "ip", "port", "attributes", "healthy", "leaseCount", "egressIP", "quarantinedUntil", "quarantinedSince", "cooldownUntil", "notLeasable", "pool"}, keys(p))
	assert.Equal(t, f.ns+"/proxy-kubernetes-sample", p["id"])
	assert.Equal(t, "127.0.0.21", p["ip"])
	assert.Equal(t, float64(3128), p["port"])
	assert.Equal(t, true, p["healthy"])

	lease := b.Lease(`{"selector":{"geo":"local"},"ttlSeconds":300}`)
	require.Equal(t, 200, lease.Status, string(lease.Body))
	assert.ElementsMatch(t, []string{"leaseID", "proxy", "expiresAt", "credentials", "sessionMoved"}, keys(lease.JSON))
	assert.Nil(t, lease.JSON["credentials"], "a proxy that asks for none")
	id := lease.JSON["leaseID"].(string)
	assert.Len(t, id, 32)
	assert.Equal(t, f.ns+"/proxy-kubernetes-sample", lease.JSON["proxy"].(map[string]any)["id"])
	assert.Equal(t, float64(1), lease.JSON["proxy"].(map[string]any)["leaseCount"])
	exp, err := time.Parse(time.RFC3339Nano, lease.JSON["expiresAt"].(string))
	require.NoError(t, err)
	assert.WithinDuration(t, time.Now().Add(300*time.Second), exp, 10*time.Second)

	rep := b.Do("POST", "/v1/leases/"+id+"/report", `{"result":"rate_limited","target":"example.com"}`)
	require.Equal(t, 200, rep.Status, string(rep.Body))
	assert.Contains(t, rep.JSON, "cooldownUntil")

	for i := range 2 {
		rel := b.Do("DELETE", "/v1/leases/"+id, "")
		assert.Equal(t, http.StatusNoContent, rel.Status, "release #%d", i+1)
		assert.Empty(t, rel.Body)
	}
	assert.Equal(t, 0, b.Counts()[f.ns+"/proxy-kubernetes-sample"])

	// The OpenAPI document is served and states what the API answers:
	// the statuses seen above, the bearer scheme, a version.
	doc := b.Do("GET", "/openapi.json", "")
	assert.Equal(t, 200, doc.Status)
	paths := doc.JSON["paths"].(map[string]any)
	responses := func(path, method string) map[string]any {
		return paths[path].(map[string]any)[method].(map[string]any)["responses"].(map[string]any)
	}
	for _, c := range []struct {
		path, method string
		want         []string
	}{
		{"/v1/proxies", "get", []string{"200", "401", "503"}},
		{"/v1/leases", "post", []string{"200", "400", "401", "409", "429", "503"}},
		{"/v1/leases/{leaseID}/renew", "post", []string{"200", "404"}},
		{"/v1/leases/{leaseID}/report", "post", []string{"200", "400", "404"}},
		{"/v1/leases/{leaseID}", "delete", []string{"204"}},
	} {
		r := responses(c.path, c.method)
		for _, code := range c.want {
			assert.Contains(t, r, code, "%s %s", c.method, c.path)
		}
	}
	assert.NotContains(t, responses("/v1/leases/{leaseID}", "delete"), "200", "a release answers 204, never 200")
	assert.Contains(t, responses("/v1/leases", "post")["429"].(map[string]any)["headers"], "Retry-After")
	assert.Contains(t, doc.JSON["securityDefinitions"], "bearer")
	assert.Equal(t, "v1", doc.JSON["info"].(map[string]any)["version"])
}

func TestLeastLoadedAndTargetCooldown(t *testing.T) {
	f := newFleet(t)
	for i := range 3 {
		f.add(fmt.Sprintf("p%d", i), fmt.Sprintf("127.0.0.%d", 30+i), map[string]string{"geo": "eu"})
	}
	b := startBroker(t, f, proc.StartRedis(t, false), "--cooldown", "4s")
	b.WaitListed(3)

	var ids []string
	lease := func(body string) rest.Reply {
		r := b.Lease(body)
		if r.Status == 200 {
			ids = append(ids, r.JSON["leaseID"].(string))
		}
		return r
	}
	releaseAll := func() {
		for _, id := range ids {
			require.Equal(t, 204, b.Do("DELETE", "/v1/leases/"+id, "").Status)
		}
		ids = nil
	}
	for range 6 {
		r := lease(`{"selector":{"geo":"eu"}}`)
		require.Equal(t, 200, r.Status, string(r.Body))
	}
	for id, n := range b.Counts() {
		assert.Equal(t, 2, n, "least-loaded spreads 6 leases as 2 each (%s)", id)
	}
	releaseAll()

	// One proxy rate-limited on a.example: never leased for a.example
	// while it cools down, still leased for b.example.
	r := lease(`{"selector":{"geo":"eu"},"target":"a.example"}`)
	require.Equal(t, 200, r.Status)
	limited := r.JSON["proxy"].(map[string]any)["id"].(string)
	rep := b.Do("POST", "/v1/leases/"+r.JSON["leaseID"].(string)+"/report", `{"result":"rate_limited","target":"a.example"}`)
	require.Equal(t, 200, rep.Status, string(rep.Body))
	releaseAll()
	// Two leases for a.example load the other two proxies, so the cooling
	// one is the only least-loaded proxy left: b.example must get it. The
	// 4 s cooldown outlasts these few round trips on a loaded machine.
	for range 3 {
		for range 2 {
			ra := lease(`{"selector":{"geo":"eu"},"target":"a.example"}`)
			require.Equal(t, 200, ra.Status, string(ra.Body))
			assert.NotEqual(t, limited, ra.JSON["proxy"].(map[string]any)["id"], "cooling proxy leased for its target")
		}
		rb := lease(`{"selector":{"geo":"eu"},"target":"b.example"}`)
		require.Equal(t, 200, rb.Status, string(rb.Body))
		assert.Equal(t, limited, rb.JSON["proxy"].(map[string]any)["id"], "the cooldown applies to that target only")
		releaseAll()
	}

	// The cooldown expires on its own: with every load at zero, ties are
	// random, so the proxy comes back for a.example once it has expired.
	require.Eventually(t, func() bool {
		ra := lease(`{"selector":{"geo":"eu"},"target":"a.example"}`)
		back := ra.Status == 200 && ra.JSON["proxy"].(map[string]any)["id"] == limited
		releaseAll()
		return back
	}, 20*time.Second, 20*time.Millisecond, "the cooldown never expired")
}

func TestTwoReplicasNeverPassTheCap(t *testing.T) {
	f := newFleet(t)
	for i := range 3 {
		f.add(fmt.Sprintf("c%d", i), fmt.Sprintf("127.0.0.%d", 40+i), nil)
	}
	r := proc.StartRedis(t, false)
	b1 := startBroker(t, f, r, "--lease-cap", "10")
	b2 := startBroker(t, f, r, "--lease-cap", "10")
	b1.WaitListed(3)
	b2.WaitListed(3)

	var mu sync.Mutex
	granted, exhausted := 0, 0
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := b1
			if i%2 == 1 {
				b = b2
			}
			resp := b.Lease(`{"ttlSeconds":300}`)
			mu.Lock()
			defer mu.Unlock()
			switch resp.Status {
			case 200:
				granted++
			case http.StatusTooManyRequests:
				exhausted++
				assert.Contains(t, string(resp.Body), "ALL_AT_CAP")
			default:
				t.Errorf("unexpected %d: %s", resp.Status, resp.Body)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 30, granted, "3 proxies x cap 10")
	assert.Equal(t, 170, exhausted)
	for id, n := range b1.Counts() {
		assert.Equal(t, 10, n, "%s", id)
	}
	assert.Equal(t, b1.Counts(), b2.Counts(), "both replicas see the same state")
}

func TestBrokerKilledAndRestartedKeepsEverything(t *testing.T) {
	f := newFleet(t)
	f.add("k0", "127.0.0.50", nil)
	f.add("k1", "127.0.0.51", nil)
	b := startBroker(t, f, proc.StartRedis(t, false))
	b.WaitListed(2)
	var ids []string
	proxyOf := map[string]string{}
	for range 3 {
		r := b.Lease(`{"target":"shop.example"}`)
		require.Equal(t, 200, r.Status)
		id := r.JSON["leaseID"].(string)
		ids = append(ids, id)
		proxyOf[id] = r.JSON["proxy"].(map[string]any)["id"].(string)
	}
	rep := b.Do("POST", "/v1/leases/"+ids[0]+"/report", `{"result":"rate_limited","target":"shop.example"}`)
	require.Equal(t, 200, rep.Status)
	before := b.Counts()

	b.Restart()
	b.WaitListed(2)
	assert.Equal(t, before, b.Counts(), "lease counts survive the restart")
	for _, id := range ids {
		r := b.Do("POST", "/v1/leases/"+id+"/renew", `{"ttlSeconds":60}`)
		assert.Equal(t, 200, r.Status, "lease %s still valid: %s", id, r.Body)
	}
	for range 4 {
		r := b.Lease(`{"target":"shop.example","ttlSeconds":10}`)
		require.Equal(t, 200, r.Status, string(r.Body))
		assert.NotEqual(t, proxyOf[ids[0]], r.JSON["proxy"].(map[string]any)["id"], "the cooldown survived the restart")
	}
}

func TestRedisDownAnswers503ThenRecovers(t *testing.T) {
	f := newFleet(t)
	f.add("r0", "127.0.0.60", nil)
	r := proc.StartRedis(t, true)
	b := startBroker(t, f, r)
	b.WaitListed(1)
	ok := b.Lease(`{}`)
	require.Equal(t, 200, ok.Status)
	held := ok.JSON["leaseID"].(string)

	r.Kill()
	for _, call := range []func() rest.Reply{
		func() rest.Reply { return b.Lease(`{}`) },
		func() rest.Reply { return b.Do("GET", "/v1/proxies", "") },
		func() rest.Reply { return b.Do("DELETE", "/v1/leases/"+held, "") },
		func() rest.Reply { return b.Do("POST", "/v1/leases/"+held+"/report", `{"result":"ok"}`) },
	} {
		resp := call()
		assert.Equal(t, http.StatusServiceUnavailable, resp.Status, string(resp.Body))
		assert.Contains(t, string(resp.Body), "lease store unavailable; retry")
	}
	rz, err := http.Get(b.Ops + "/readyz")
	require.NoError(t, err)
	_ = rz.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, rz.StatusCode, "not ready while Redis is down")
	m := b.Metrics() // still scrapes while Redis is down
	assert.Equal(t, 0.0, m["proxy_operator_broker_redis_up"])

	r.Start()
	require.Eventually(t, func() bool { return b.Lease(`{}`).Status == 200 }, 30*time.Second, 100*time.Millisecond, "never recovered")
	assert.Equal(t, 2, b.Counts()[f.ns+"/r0"], "the lease held before the outage survived (AOF)")
	m = b.Metrics()
	assert.Equal(t, 1.0, m["proxy_operator_broker_redis_up"])
	assert.Equal(t, 2.0, m[`proxy_operator_broker_live_leases{proxy_namespace="`+f.ns+`"}`], "the fleet gauge counts both leases")
	assert.Positive(t, m.Sum(`grpc_server_handled_total{grpc_code="OK",grpc_method="CreateLease"`), "REST leases count as gRPC calls")
	assert.Equal(t, 204, b.Do("DELETE", "/v1/leases/"+held, "").Status)
	assert.False(t, b.P.Exited(), "the broker was never restarted")
}

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	f := newFleet(t)
	f.add("v0", "127.0.0.70", map[string]string{"geo": "eu"})
	b := startBroker(t, f, proc.StartRedis(t, false))
	b.WaitListed(1)
	good := b.Lease(`{"target":"x.example"}`)
	require.Equal(t, 200, good.Status)
	id := good.JSON["leaseID"].(string)
	before := b.Counts()

	cases := []struct {
		name, method, path, body string
		status                   int
		want                     string
	}{
		{"malformed JSON", "POST", "/v1/leases", `{"selector":`, 400, "unexpected EOF"},
		{"unknown field", "POST", "/v1/leases", `{"selektor":{}}`, 400, `unknown field "selektor"`},
		{"oversize body", "POST", "/v1/leases", `{"target":"` + strings.Repeat("a", 10<<20) + `"}`, 400, "too large"},
		{"negative ttl", "POST", "/v1/leases", `{"ttlSeconds":-5}`, 400, "ttlSeconds"},
		{"huge ttl", "POST", "/v1/leases", `{"ttlSeconds":2000000000}`, 400, "ttlSeconds: must be between 10 and 3600"},
		{"empty selector value", "POST", "/v1/leases", `{"selector":{"geo":""}}`, 400, "selector.geo: must not be empty"},
		{"bad target", "POST", "/v1/leases", `{"target":"a b"}`, 400, "target"},
		{"unknown lease report", "POST", "/v1/leases/" + strings.Repeat("0", 32) + "/report", `{"result":"ok"}`, 404, "lease not found"},
		{"unknown result", "POST", "/v1/leases/" + id + "/report", `{"result":"great"}`, 400, "result: must be one of ok, rate_limited, blocked, error"},
		{"status code out of range", "POST", "/v1/leases/" + id + "/report", `{"result":"blocked","statusCode":700}`, 400, "statusCode: must be between 100 and 599"},
		{"negative latency", "POST", "/v1/leases/" + id + "/report", `{"result":"ok","latencyMs":-1}`, 400, "latencyMs"},
		{"bad session key", "POST", "/v1/leases", `{"sessionKey":"a/b"}`, 400, "sessionKey"},
		{"session key too long", "POST", "/v1/leases", `{"sessionKey":"` + strings.Repeat("s", 129) + `"}`, 400, "sessionKey"},
		{"path traversal id", "DELETE", "/v1/leases/..%2F..%2Fetc", "", 404, "Not Found"},
		{"dot-dot id", "DELETE", "/v1/leases/%2e%2e", "", 400, "leaseID"},
		{"short id", "POST", "/v1/leases/abc/renew", `{}`, 400, "leaseID"},
		{"renew unknown", "POST", "/v1/leases/" + strings.Repeat("f", 32) + "/renew", `{}`, 404, "lease not found"},
		{"no candidate", "POST", "/v1/leases", `{"selector":{"geo":"mars"}}`, 429, "NO_MATCHING_PROXY"},
		{"list repeated attribute", "GET", "/v1/proxies?geo=eu&geo=us", "", 400, "give one value"},
		{"negative page size", "GET", "/v1/proxies?pageSize=-1", "", 400, "page_size must not be negative"},
		{"page token not given by the API", "GET", "/v1/proxies?pageToken=bm90LWEtdG9rZW4", "", 400, "page_token"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := b.Do(tc.method, tc.path, tc.body)
			assert.Equal(t, tc.status, r.Status, string(r.Body))
			require.Contains(t, r.JSON, "message", "JSON error body: %s", r.Body)
			assert.Contains(t, fmt.Sprint(r.JSON["message"], r.JSON["details"]), tc.want)
		})
	}
	assert.Equal(t, before, b.Counts(), "lease counts unchanged")
	assert.Equal(t, 200, b.Do("POST", "/v1/leases/"+id+"/renew", `{}`).Status, "the good lease is untouched")
	// A refused lease says when to come back: no match waits for the
	// fleet to change; a full fleet frees up any moment.
	assert.Equal(t, "10", b.Lease(`{"selector":{"geo":"mars"}}`).Header.Get("Retry-After"))
	for b.Lease(`{}`).Status == 200 {
	}
	full := b.Lease(`{}`)
	assert.Equal(t, 429, full.Status)
	assert.Contains(t, string(full.Body), "ALL_AT_CAP")
	assert.Equal(t, "1", full.Header.Get("Retry-After"))
	assert.Contains(t, string(full.Body), "google.rpc.RetryInfo", "gRPC callers get the same as RetryInfo")
	// Attribute filters on list work as plain query parameters.
	eu := b.Do("GET", "/v1/proxies?geo=eu", "")
	assert.Len(t, eu.JSON["proxies"], 1)
	us := b.Do("GET", "/v1/proxies?geo=us", "")
	assert.Len(t, us.JSON["proxies"], 0)
	// Pages over REST: pageSize and pageToken are the request's, not
	// attribute filters.
	f.add("v1", "127.0.0.71", map[string]string{"geo": "eu"})
	b.WaitListed(2)
	first := b.Do("GET", "/v1/proxies?geo=eu&pageSize=1", "")
	require.Equal(t, 200, first.Status, string(first.Body))
	require.Len(t, first.JSON["proxies"], 1)
	token, _ := first.JSON["nextPageToken"].(string)
	require.NotEmpty(t, token, "%s", first.Body)
	second := b.Do("GET", "/v1/proxies?geo=eu&pageSize=1&pageToken="+token, "")
	require.Equal(t, 200, second.Status, string(second.Body))
	require.Len(t, second.JSON["proxies"], 1)
	assert.NotEqual(t, first.JSON["proxies"], second.JSON["proxies"])
	assert.Empty(t, second.JSON["nextPageToken"], "the last page")
	assert.Equal(t, 400, b.Do("GET", "/v1/proxies?geo=us&pageSize=1&pageToken="+token, "").Status, "the token answers only the filters it was given for")
}

func TestAuthOnRESTAndGRPC(t *testing.T) {
	f := newFleet(t)
	f.add("a0", "127.0.0.80", nil)
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("first-token\n"), 0o600))
	b := startBroker(t, f, proc.StartRedis(t, false), "--token-file", tokenFile)

	assert.Equal(t, 401, b.Do("GET", "/v1/proxies", "").Status)
	assert.Equal(t, 401, b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer wrong").Status)
	require.Eventually(t, func() bool {
		r := b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer first-token")
		return r.Status == 200 && len(r.JSON["proxies"].([]any)) == 1
	}, 30*time.Second, 50*time.Millisecond)

	conn, err := grpc.NewClient(b.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	c := leasev1.NewLeaseServiceClient(conn)
	_, err = c.CreateLease(context.Background(), &leasev1.CreateLeaseRequest{})
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer first-token")
	l, err := c.CreateLease(ctx, &leasev1.CreateLeaseRequest{TtlSeconds: 60})
	require.NoError(t, err)
	_, err = c.ReleaseLease(ctx, &leasev1.ReleaseLeaseRequest{LeaseId: l.GetLeaseId()})
	require.NoError(t, err)
	_, err = c.ReleaseLease(ctx, &leasev1.ReleaseLeaseRequest{LeaseId: l.GetLeaseId()})
	require.NoError(t, err, "release is idempotent over gRPC too")
	for name, call := range map[string]func() error{
		"release with empty leaseID": func() error { _, err := c.ReleaseLease(ctx, &leasev1.ReleaseLeaseRequest{}); return err },
		"renew with empty leaseID":   func() error { _, err := c.RenewLease(ctx, &leasev1.RenewLeaseRequest{}); return err },
		"report with empty result": func() error {
			_, err := c.ReportLease(ctx, &leasev1.ReportLeaseRequest{LeaseId: l.GetLeaseId()})
			return err
		},
		"empty selector key": func() error {
			_, err := c.CreateLease(ctx, &leasev1.CreateLeaseRequest{Selector: map[string]string{"": "x"}})
			return err
		},
		"selector value over 63": func() error {
			_, err := c.CreateLease(ctx, &leasev1.CreateLeaseRequest{Selector: map[string]string{"geo": strings.Repeat("x", 64)}})
			return err
		},
	} {
		err := call()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
	}
	_, err = c.CreateLease(ctx, &leasev1.CreateLeaseRequest{Selector: map[string]string{"geo": strings.Repeat("x", 2<<20)}})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "an oversized message is refused before it is read")

	// Rotating the file switches tokens without a restart; a named line
	// names its callers in the metrics, and the token itself is nowhere.
	require.NoError(t, os.WriteFile(tokenFile, []byte("team-a:second-token"), 0o600))
	require.Eventually(t, func() bool {
		return b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer second-token").Status == 200
	}, 20*time.Second, 100*time.Millisecond)
	assert.Equal(t, 401, b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer first-token").Status)
	m := b.Metrics()
	assert.Positive(t, m.Sum(`proxy_operator_broker_calls_by_token_total{code="OK",method="ListProxies",token="team-a"}`))
	assert.Positive(t, m.Sum(`proxy_operator_broker_calls_by_token_total{code="OK",method="CreateLease",token="token-1"}`), "an unnamed line is named by its number")
	for _, secret := range []string{"first-token", "second-token"} {
		assert.NotContains(t, b.P.Log(), secret, "no token in the log")
	}
}

func TestNoTokenServesUnauthenticatedAndWarns(t *testing.T) {
	f := newFleet(t)
	b := startBroker(t, f, proc.StartRedis(t, false))
	assert.Equal(t, 200, b.Do("GET", "/v1/proxies", "").Status)
	assert.Contains(t, b.P.Log(), "NO CREDENTIALS CONFIGURED")
}

// With an exporter configured, a lease over REST and one over gRPC leave
// spans from every layer: the HTTP handler, the gRPC server, the store
// and Redis. Without one the broker adds no instrumentation at all.
func TestTracesWhenAnExporterIsSet(t *testing.T) {
	f := newFleet(t)
	f.add("p", "127.0.0.31", nil)
	b := framework.NewBroker(t, env, f.ns, proc.StartRedis(t, false))
	b.Env = []string{"OTEL_TRACES_EXPORTER=console"}
	b.Start()
	p := b.P
	b.WaitListed(1)
	require.Equal(t, 200, b.Lease(`{}`).Status)
	conn, err := grpc.NewClient(b.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, err = leasev1.NewLeaseServiceClient(conn).CreateLease(context.Background(), &leasev1.CreateLeaseRequest{})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		log := p.Log()
		for _, span := range []string{`"Name":"POST /"`, `"Name":"egressproxies.lease.v1.LeaseService/CreateLease"`, `"Name":"store.Acquire"`, `"Name":"redis.pipeline evalsha"`} {
			if !strings.Contains(log, span) {
				return false
			}
		}
		return true
	}, 20*time.Second, 100*time.Millisecond, "spans from every layer")
}
