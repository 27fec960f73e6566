package broker

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// echoHosts are n HTTPS hosts, each on a loopback address of its own
// (n targets), answering with the address the request came from: the
// proxy's exit.
func echoHosts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := range n {
		out = append(out, proc.Serve(t, fmt.Sprintf("127.0.31.%d", i+1), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ip, _, _ := net.SplitHostPort(r.RemoteAddr)
			_, _ = io.WriteString(w, ip)
		}), true).URL+"/")
	}
	return out
}

// quarantinedIPs are the addresses of the proxies quarantined now.
func (f *gwFleet) quarantinedIPs() []string {
	var out []string
	for _, p := range f.proxiesFor("") {
		if p["quarantinedUntil"] != nil {
			out = append(out, p["ip"].(string))
		}
	}
	return out
}

// crawlUntilQuarantined fetches the targets in turn, each through c,
// until a proxy is quarantined (at most 60 fetches); every fetch must be
// served, through a proxy that is not bad.
func (f *gwFleet) crawlUntilQuarantined(t *testing.T, c *crawler, targets []string, bad string) []string {
	t.Helper()
	for i := range 60 {
		g := fetch(c, targets[i%len(targets)])
		require.NoError(t, g.err)
		require.Equal(t, 200, g.status, "%s", g.body)
		require.NotEqual(t, bad, g.body, "served through a proxy that works")
		if q := f.quarantinedIPs(); len(q) > 0 {
			return q
		}
	}
	return nil
}

// A proxy that really fails is still blamed, and quarantined as before,
// but the gateway's retry hides it: the client gets its answer through
// another proxy, told how many were tried, and a session leaves the
// proxy that failed it for good.
func TestGatewayRetriesPastAFailedProxy(t *testing.T) {
	f := newGatewayFleet(t)
	targets := echoHosts(t, 4)
	live := map[string]bool{f.squids[0].Host: true, f.squids[1].Host: true}

	// A session settles on its proxy; then that proxy's Squid is killed.
	cs := f.crawler("attr.pool=gw,session=s-1")
	first := fetch(cs, targets[0])
	require.NoError(t, first.err)
	require.True(t, live[first.body], first.body)
	dead := 0
	if first.body == f.squids[1].Host {
		dead = 1
	}
	f.squids[dead].Kill()
	other := f.squids[1-dead].Host

	moved := fetch(cs, targets[0])
	require.NoError(t, moved.err)
	require.Equal(t, 200, moved.status, moved.body)
	assert.Equal(t, other, moved.body, "the retry went through the live proxy")
	assert.Equal(t, "2", moved.connect.Get("X-Egress-Proxies-Attempts"), "the second proxy served it")
	for range 3 {
		again := fetch(cs, targets[0])
		require.NoError(t, again.err)
		assert.Equal(t, other, again.body, "the session stays on the proxy that did not fail it")
		assert.Equal(t, "1", again.connect.Get("X-Egress-Proxies-Attempts"))
	}

	// Errors on three distinct targets quarantine the dead proxy; every
	// client meanwhile gets its answer.
	q := f.crawlUntilQuarantined(t, f.crawler("attr.pool=gw"), targets, f.squids[dead].Host)
	assert.Equal(t, []string{f.squids[dead].Host}, q, "the dead proxy, and only it, is quarantined")
	f.waitNoLeases()
	m := f.b.Metrics()
	assert.GreaterOrEqual(t, m[`proxy_operator_broker_gateway_reports_total{kind="connect",result="error"}`], float64(3))
	assert.GreaterOrEqual(t, m[`proxy_operator_broker_gateway_retries_total`], float64(3))
}

// A proxy that refuses the credentials the fleet has for it fails its
// own hop (a 407 to CONNECT): alone, the client is told the proxy
// failed; among others, it is passed over until it is quarantined.
func TestGatewayRetriesPastRefusedCredentials(t *testing.T) {
	f := newGatewayFleet(t)
	targets := echoHosts(t, 4)
	wrong := squidProxy(t, f.ns, "p-wrong", "127.0.8.3", map[string]string{"pool": "gw", "creds": "wrong"})
	wrong.Kill()
	// The same address now asks for another password than its Secret has.
	proc.StartSquidWithAuthAt(t, "127.0.8.3", wrong.Port, "squid-user", "not-the-secrets")
	require.Eventually(t, func() bool { return len(f.proxiesFor("")) == 3 }, 30*time.Second, 50*time.Millisecond)

	only := fetch(f.crawler("attr.pool=gw,attr.creds=wrong"), targets[0])
	require.NoError(t, only.err)
	assert.Equal(t, 502, only.status, only.body)
	assert.Equal(t, "PROXY_FAILED", only.header.Get("X-Egress-Proxies-Reason"))
	assert.Equal(t, "proxy", only.header.Get("X-Egress-Proxies-Fault"))
	assert.Equal(t, "true", only.header.Get("X-Egress-Proxies-Retryable"))
	assert.Contains(t, only.body, "407")
	assert.NotEmpty(t, only.header.Get("X-Egress-Proxies-Lease"), "the refusal names the lease that failed")

	// Among the others, it is hidden by the retry until quarantined.
	q := f.crawlUntilQuarantined(t, f.crawler("attr.pool=gw"), targets, "127.0.8.3")
	assert.Equal(t, []string{"127.0.8.3"}, q)
	f.waitNoLeases()
}

// A block seen inside TLS is reported by the lease id the CONNECT reply
// named, while the tunnel is open: it cools exactly the proxy that served
// it down for the site.
func TestGatewayBlockInsideTLSReportedByLease(t *testing.T) {
	f := newGatewayFleet(t)
	// The exit IPs the prober would have written: each Squid egresses
	// from its own address.
	var list v1.ProxyList
	require.NoError(t, env.Client.List(t.Context(), &list, client.InNamespace(f.ns)))
	for i := range list.Items {
		px := &list.Items[i]
		px.Status.EgressIP = px.Status.IP
		require.NoError(t, env.Client.Status().Update(t.Context(), px))
	}
	require.Eventually(t, func() bool {
		for _, p := range f.proxiesFor("") {
			if p["egressIP"] == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond)
	c, resp := tunnel(t, f.gw, basic("attr.pool=gw", gwToken), f.echo.Listener.Addr().String())
	lease, proxy := resp.Header.Get("X-Egress-Proxies-Lease"), resp.Header.Get("X-Egress-Proxies-Proxy")
	require.NotEmpty(t, lease)
	assert.Equal(t, "1", resp.Header.Get("X-Egress-Proxies-Attempts"))
	exit := resp.Header.Get("X-Egress-Proxies-Exit-IP")
	assert.True(t, exit == f.squids[0].Host || exit == f.squids[1].Host, "the exit IP the target sees: %q", exit)

	rep := f.b.Do("POST", "/v1/leases/"+lease+"/report", `{"result":"blocked","statusCode":403}`, "Authorization", "Bearer "+gwToken)
	require.Equal(t, 200, rep.Status, string(rep.Body))
	assert.Equal(t, []any{"COOLDOWN_STARTED"}, rep.JSON["actions"])
	_ = c.Close()
	f.waitNoLeases()
	for _, p := range f.proxiesFor("127.0.0.1") {
		assert.Equal(t, p["id"] == proxy, p["cooldownUntil"] != nil, "%s: only the proxy that served the tunnel cools down", p["id"])
	}
}
