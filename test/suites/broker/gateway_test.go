package broker

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// Any HTTP client crawls through the gateway by setting it as its proxy:
// HTTPS through a CONNECT tunnel to a leased proxy (the target sees the
// proxy's address), plain HTTP forwarded; each lease released when its
// tunnel or request ends, and each outcome reported.
func TestGatewayLeasesAProxyPerTunnel(t *testing.T) {
	f := newGatewayFleet(t)
	proxies := map[string]bool{f.squids[0].Host: true, f.squids[1].Host: true}

	c := f.client("attr.pool=gw", gwToken, false)
	seen := map[string]int{}
	for range 6 {
		code, body, _ := get(t, c, f.echo.URL+"/ip")
		require.Equal(t, 200, code, body)
		require.True(t, proxies[body], "the target saw %s, not a leased proxy", body)
		seen[body]++
	}
	assert.Len(t, seen, 2, "least-loaded leasing spreads tunnels over both proxies: %v", seen)
	f.waitNoLeases()

	// Held open, a keep-alive tunnel holds its lease.
	keep := f.client("attr.pool=gw", gwToken, true)
	code, _, _ := get(t, keep, f.echo.URL+"/ip")
	require.Equal(t, 200, code)
	assert.Equal(t, 1, f.liveLeases(), "the open tunnel's lease")
	keep.CloseIdleConnections()
	f.waitNoLeases()

	m := f.b.Metrics()
	assert.Equal(t, float64(7), m[`proxy_operator_broker_gateway_reports_total{kind="connect",result="ok"}`], "each tunnel that carried an answer is ok")
	assert.Equal(t, float64(7), m[`proxy_operator_broker_calls_by_token_total{code="OK",method="CreateLease",token="crawlers"}`], "gateway leases are counted under the token's name")
	assert.Equal(t, float64(7), m[`proxy_operator_broker_gateway_requests_total{code="200",kind="connect"}`])
}

// A session keeps its proxy from one connection to the next, as the lease
// API's sessionKey does; another session, or another token's session of
// the same name, is its own.
func TestGatewaySessionsStick(t *testing.T) {
	f := newGatewayFleet(t)
	ip := func(user, token string) string {
		code, body, _ := get(t, f.client(user, token, false), f.echo.URL+"/ip")
		require.Equal(t, 200, code, body)
		return body
	}
	home := ip("attr.pool=gw,session=login-1", gwToken)
	for range 4 {
		assert.Equal(t, home, ip("attr.pool=gw,session=login-1", gwToken), "one connection per request, the same proxy")
	}
	f.waitNoLeases()

	// A block seen inside TLS is reported by session and target.
	host := "127.0.0.1"
	rep := f.b.Do("POST", "/v1/sessions/login-1/report", `{"target":"`+host+`","result":"blocked","statusCode":403}`, "Authorization", "Bearer "+otherToken)
	assert.Equal(t, 404, rep.Status, "another token's session: %s", rep.Body)
	rep = f.b.Do("POST", "/v1/sessions/login-1/report", `{"target":"`+host+`","result":"blocked","statusCode":403}`, "Authorization", "Bearer "+gwToken)
	require.Equal(t, 200, rep.Status, string(rep.Body))
	assert.Equal(t, []any{"COOLDOWN_STARTED"}, rep.JSON["actions"])
	moved := ip("attr.pool=gw,session=login-1", gwToken)
	assert.NotEqual(t, home, moved, "the session's proxy cools down for the target: the session moves")

	rep = f.b.Do("POST", "/v1/sessions/never-used/report", `{"target":"`+host+`","result":"blocked"}`, "Authorization", "Bearer "+gwToken)
	assert.Equal(t, 404, rep.Status)
	assert.Contains(t, string(rep.Body), `has had no lease for target`)
	f.waitNoLeases()
}

// Plain HTTP answers are classified as the clients' default policy does:
// the site's 429 to one proxy cools it down for the site, so the crawl
// goes on through the other; a captcha page is a block.
func TestGatewayClassifiesPlainHTTP(t *testing.T) {
	f := newGatewayFleet(t)
	c := f.client("attr.pool=gw", gwToken, true)
	limited := 0
	for range 10 {
		code, body, h := get(t, c, f.site.URL+"/page")
		if code == 429 {
			limited++
			assert.Equal(t, "60", h.Get("Retry-After"), "the site's answer passes through")
			continue
		}
		require.Equal(t, 200, code, body)
		assert.Equal(t, "page for "+f.squids[1].Host, body)
	}
	assert.LessOrEqual(t, limited, 1, "after the first 429 the limited proxy cools down for the site")
	for _, p := range f.b.Do("GET", "/v1/proxies?target=127.0.0.1", "", "Authorization", "Bearer "+gwToken).JSON["proxies"].([]any) {
		p := p.(map[string]any)
		if p["ip"] == f.limited && limited == 1 {
			assert.NotNil(t, p["cooldownUntil"], "the cooldown shows in the API")
		}
	}
	code, _, _ := get(t, c, f.site.URL+"/blocked")
	assert.Equal(t, 200, code)
	c.CloseIdleConnections()
	f.waitNoLeases()
	m := f.b.Metrics()
	assert.Equal(t, float64(limited), m[`proxy_operator_broker_gateway_reports_total{kind="http",result="rate_limited"}`])
	assert.Equal(t, float64(1), m[`proxy_operator_broker_gateway_reports_total{kind="http",result="blocked"}`])
	assert.Equal(t, float64(10-limited), m[`proxy_operator_broker_gateway_reports_total{kind="http",result="ok"}`])

	// A body past the head's bound comes whole: only the head is bounded.
	code, body, _ := get(t, c, f.site.URL+"/big")
	assert.Equal(t, 200, code)
	assert.Len(t, body, 300<<10)
	// A 403 error page on plain HTTP (here Squid's own, refusing its cache
	// manager) is judged as any answer: a site can dress its block as a
	// proxy's denial, so it counts as a block, never as the proxy's error.
	code, body, h := get(t, c, "http://"+f.squids[1].Addr+"/squid-internal-mgr/info")
	assert.Equal(t, 403, code, body)
	assert.Equal(t, "SITE_BLOCKED", h.Get("X-Egress-Proxies-Reason"))
	assert.NotContains(t, body, "squid", "the proxy's own page is replaced by the gateway's")
	c.CloseIdleConnections()
	f.waitNoLeases()
	assert.Zero(t, f.b.Metrics()[`proxy_operator_broker_gateway_reports_total{kind="http",result="error"}`])
}

// Refusals reach the client as HTTP with a reason, and cost nothing: no
// lease is taken, no proxy is dialled, nothing internal is named.
func TestGatewayRefusals(t *testing.T) {
	f := newGatewayFleet(t, "--gateway-header-timeout", "1s", "--gateway-max-header-bytes", "4096")
	auth := basic("attr.pool=gw", gwToken)
	cases := []struct {
		name, head string
		code       int
		reason     string
		msg        string
	}{
		{"no credentials", "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n", 407, "PROXY_AUTH", "no proxy credentials"},
		{"wrong token", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n" + basic("", "nope") + "\r\n\r\n", 407, "PROXY_AUTH", "invalid proxy password"},
		{"unknown option", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n" + basic("country=us", gwToken) + "\r\n\r\n", 400, "BAD_OPTIONS", `option "country" is unknown`},
		{"option twice", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n" + basic("session=a,session=b", gwToken) + "\r\n\r\n", 400, "BAD_OPTIONS", "given twice"},
		{"bad session", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n" + basic("session=a b", gwToken) + "\r\n\r\n", 400, "", "sessionKey"},
		{"connect without port", "CONNECT 127.0.0.1 HTTP/1.1\r\n" + auth + "\r\n\r\n", 400, "BAD_DESTINATION", "give host:port"},
		{"origin form", "GET /index.html HTTP/1.1\r\nHost: example.com\r\n" + auth + "\r\n\r\n", 400, "BAD_DESTINATION", "send an absolute http:// URI or CONNECT"},
		{"malformed line", "CONNECT\r\n\r\n", 400, "BAD_REQUEST", "malformed"},
		{"huge header", "CONNECT 127.0.0.1:443 HTTP/1.1\r\nX-Big: " + strings.Repeat("a", 8192) + "\r\n\r\n", 431, "HEAD_TOO_LARGE", "over 4096 bytes"},
		{"metadata service", "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\nHost: 169.254.169.254\r\n" + auth + "\r\n\r\n", 403, "EGRESS_DENIED", "outside the egress policy: it is not a public address"},
		{"private range", "CONNECT 10.0.0.1:443 HTTP/1.1\r\n" + auth + "\r\n\r\n", 403, "EGRESS_DENIED", "10.0.0.1:443 is outside the egress policy"},
		{"port not allowed", "CONNECT 203.0.113.5:22 HTTP/1.1\r\n" + auth + "\r\n\r\n", 403, "EGRESS_DENIED", "port 22 is not an egress port (80,443)"},
		{"no proxy qualifies", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n" + basic("attr.pool=none", gwToken) + "\r\n\r\n", 503, "NO_MATCHING_PROXY", "no proxy available"},
	}
	logSize := func() (n int) {
		for _, sq := range f.squids {
			b, err := os.ReadFile(sq.AccessLog)
			require.NoError(t, err)
			n += len(b)
		}
		return n
	}
	before := logSize()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := f.raw(t, tc.head)
			body, _ := io.ReadAll(resp.Body)
			assert.Equal(t, tc.code, resp.StatusCode, string(body))
			if tc.reason != "" {
				assert.Equal(t, tc.reason, resp.Header.Get("X-Egress-Proxies-Reason"), string(body))
			}
			assert.Contains(t, string(body), tc.msg)
			assert.NotContains(t, string(body), f.squids[0].Host, "the answer names no proxy")
			assert.NotContains(t, string(body), "goroutine", "no stack")
			if tc.code == 407 {
				assert.Equal(t, `Basic realm="egress-proxies"`, resp.Header.Get("Proxy-Authenticate"))
			}
			if tc.code == 503 {
				assert.NotEmpty(t, resp.Header.Get("Retry-After"))
			}
		})
	}

	t.Run("slow client", func(t *testing.T) {
		c, err := net.Dial("tcp", f.gw)
		require.NoError(t, err)
		defer func() { _ = c.Close() }()
		_, err = io.WriteString(c, "CONNECT 127.0.0.1:443 HTTP/1.1\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err, "the gateway answers a head that never ends")
		assert.Equal(t, 408, resp.StatusCode)
	})
	assert.Zero(t, f.liveLeases(), "no refusal took a lease")
	assert.Equal(t, before, logSize(), "no refusal reached a proxy")

	// Names are checked on the addresses they resolve to: without the
	// suite's allowance, localhost is inside.
	strict := startBroker(t, f.fleet, f.redis, "--token-file", f.tokenFile, "--gateway-addr", proc.Addr(proc.FreePort(t)))
	resp := rawTo(t, strict.GatewayAddr(), fmt.Sprintf("CONNECT localhost:%d HTTP/1.1\r\n%s\r\n\r\n", f.echo.Listener.Addr().(*net.TCPAddr).Port, auth))
	body, _ := io.ReadAll(resp.Body)
	assert.Equal(t, 403, resp.StatusCode, string(body))
	assert.Contains(t, string(body), "is outside the egress policy: it is not a public address")
	assert.NotContains(t, string(body), "127.0.0.1", "the inside address is not named")
}

// The target's own limits reach the client as 429 with Retry-After, and
// one token's tunnels are bounded on each gateway.
func TestGatewayLimits(t *testing.T) {
	// No wait for a slot: the refusals are answered at once.
	f := newGatewayFleet(t, "--target-lease-cap", "1", "--gateway-token-max-tunnels", "2", "--gateway-idle-timeout", "1s", "--gateway-capacity-wait", "0")
	auth := basic("attr.pool=gw", gwToken)
	open, _ := tunnel(t, f.gw, auth, f.echo.Listener.Addr().String())
	resp := f.raw(t, fmt.Sprintf("CONNECT %s HTTP/1.1\r\n%s\r\n\r\n", f.echo.Listener.Addr(), auth))
	assert.Equal(t, 429, resp.StatusCode)
	assert.Equal(t, "TARGET_AT_CAP", resp.Header.Get("X-Egress-Proxies-Reason"))
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	// Another target is not capped; the token's third tunnel is.
	second := f.raw(t, fmt.Sprintf("CONNECT localhost:%d HTTP/1.1\r\n%s\r\n\r\n", f.echo.Listener.Addr().(*net.TCPAddr).Port, auth))
	require.Equal(t, 200, second.StatusCode, "%s %s", second.Header.Get("X-Egress-Proxies-Reason"), second.Header.Get("Retry-After"))
	sink, err := net.Listen("tcp", "127.0.0.3:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = sink.Close() })
	go func() {
		for {
			c, err := sink.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	third := f.raw(t, fmt.Sprintf("CONNECT %s HTTP/1.1\r\n%s\r\n\r\n", sink.Addr(), auth))
	assert.Equal(t, 429, third.StatusCode)
	assert.Equal(t, "TOKEN_TUNNEL_CAP", third.Header.Get("X-Egress-Proxies-Reason"))
	other := f.raw(t, fmt.Sprintf("CONNECT %s HTTP/1.1\r\n%s\r\n\r\n", sink.Addr(), basic("attr.pool=gw", otherToken)))
	assert.Equal(t, 200, other.StatusCode, "another token has its own")
	assert.Equal(t, float64(1), f.b.Metrics()[`proxy_operator_broker_gateway_token_capped_total{token="crawlers"}`])

	// An idle tunnel is closed (within two idle timeouts), and its lease
	// released.
	_ = open.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := open.Read(make([]byte, 1))
	assert.Equal(t, 0, n)
	assert.ErrorIs(t, err, io.EOF, "the gateway closed the idle tunnel")
	_ = open.Close()
	f.waitNoLeases()
}

// A tunnel's lease is renewed while it lives and ends with it; when its
// proxy stops being leasable (here: deleted), the next renewal fails and
// the tunnel is closed rather than left on a proxy the fleet gave up.
func TestGatewayTunnelEndsWithItsProxy(t *testing.T) {
	f := newGatewayFleet(t, "--gateway-lease-ttl", "10s")
	c, _ := tunnel(t, f.gw, basic("attr.pool=gw", gwToken), f.echo.Listener.Addr().String())

	var leased string
	r := f.b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer "+gwToken)
	for _, p := range r.JSON["proxies"].([]any) {
		if p := p.(map[string]any); p["leaseCount"].(float64) == 1 {
			leased = p["id"].(string)
		}
	}
	require.NotEmpty(t, leased)
	// Renewals keep it past its 10 s TTL.
	require.Eventually(t, func() bool {
		return f.b.Metrics()[`proxy_operator_broker_gateway_renewals_total{result="renewed"}`] >= 4
	}, 60*time.Second, 200*time.Millisecond)
	assert.Equal(t, 1, f.liveLeases(), "the tunnel's lease lives past its TTL")

	var px v1.Proxy
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: f.ns, Name: strings.TrimPrefix(leased, f.ns+"/")}, &px))
	require.NoError(t, env.Client.Delete(t.Context(), &px))
	_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
	n, err := c.Read(make([]byte, 1))
	assert.Equal(t, 0, n)
	assert.Error(t, err, "the gateway closed the tunnel")
	assert.Equal(t, float64(1), f.b.Metrics()[`proxy_operator_broker_gateway_renewals_total{result="ended"}`])
}

// A broker told to stop closes its tunnels and releases their leases
// before it exits; one killed outright leaves leases that end within the
// gateway's lease TTL, not the tunnels' hour.
func TestGatewayStopReleasesItsTunnels(t *testing.T) {
	f := newGatewayFleet(t, "--gateway-lease-ttl", "10s")
	open := func() { tunnel(t, f.b.GatewayAddr(), basic("attr.pool=gw", gwToken), f.echo.Listener.Addr().String()) }
	for range 3 {
		open()
	}
	require.Equal(t, 3, f.liveLeases())
	f.b.P.Signal(syscall.SIGTERM)
	code, err := f.b.P.Wait(30 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	f.b.Start()
	assert.Equal(t, 0, f.liveLeases(), "every tunnel's lease was released before the broker exited")

	for range 2 {
		open()
	}
	require.Equal(t, 2, f.liveLeases())
	f.b.Restart() // SIGKILL
	require.Eventually(t, func() bool { return f.liveLeases() == 0 }, 30*time.Second, 200*time.Millisecond,
		"a killed gateway's leases end within its 10 s lease TTL")
}

// The chart's default gateway password: a --gateway-token-file token
// opens tunnels and plain requests through the gateway, and reports by
// session what its own requests saw; the lease API refuses it anything
// else (its leases carry proxies' credentials).
func TestTheGatewayTokenFileIsGatewayOnly(t *testing.T) {
	const gwOnly = "gateway-only-crawler-password"
	file := filepath.Join(t.TempDir(), "gateway-token")
	require.NoError(t, os.WriteFile(file, []byte(gwOnly+"\n"), 0o600))
	f := newGatewayFleet(t, "--gateway-token-file", file)
	code, _, _ := get(t, f.client("", gwOnly, false), f.echo.URL)
	assert.Equal(t, http.StatusOK, code, "a tunnel with the gateway token")
	code, _, _ = get(t, f.client("session=s1", gwOnly, false), f.site.URL+"/blocked")
	assert.Equal(t, http.StatusOK, code, "a plain request with the gateway token")
	r := f.b.Do("POST", "/v1/sessions/s1/report", `{"target":"127.0.0.1","result":"blocked","statusCode":200}`, "Authorization", "Bearer "+gwOnly)
	assert.Equal(t, http.StatusOK, r.Status, "a crawler behind a proxy URL reports a ban by session with the same password: %s", r.Body)
	r = f.b.Do("POST", "/v1/leases", `{"ttlSeconds":60}`, "Authorization", "Bearer "+gwOnly)
	assert.Equal(t, http.StatusForbidden, r.Status, string(r.Body))
	assert.Contains(t, string(r.Body), "for the proxy gateway (verbs: gateway, report)")
	r = f.b.Do("GET", "/v1/leases", "", "Authorization", "Bearer "+gwOnly)
	assert.Equal(t, http.StatusForbidden, r.Status, "nor may it inspect leases: %s", r.Body)
	f.waitNoLeases()
}
