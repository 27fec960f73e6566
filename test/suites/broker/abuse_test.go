package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// dialFrom opens a connection to addr from the loopback address src.
func dialFrom(t *testing.T, src, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// refusedOnAccept reads the answer a connection got before it sent a byte.
func refusedOnAccept(t *testing.T, c net.Conn) *http.Response {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "the excess connection is answered at once, before it sends anything")
	return resp
}

// A client without a token cannot hold the gateway: connections are
// bounded per source address and in all, the excess is answered on
// accept, and the lease API goes on answering meanwhile.
func TestGatewayBoundsConnectionsInAllAndPerSource(t *testing.T) {
	f := newGatewayFleet(t, "--gateway-max-conns", "12", "--gateway-max-conns-per-source", "5")
	var held []net.Conn
	for range 5 {
		held = append(held, dialFrom(t, "127.0.0.1", f.gw))
	}
	// Every held connection is accepted before the next is judged.
	require.Eventually(t, func() bool { return f.b.Metrics()["proxy_operator_broker_gateway_connections"] == 5 }, 10*time.Second, 20*time.Millisecond)
	resp := refusedOnAccept(t, dialFrom(t, "127.0.0.1", f.gw))
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "SOURCE_CONN_CAP", resp.Header.Get("X-Egress-Proxies-Reason"))
	assert.Equal(t, "1", resp.Header.Get("Retry-After"))

	for _, src := range []string{"127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.2", "127.0.0.3", "127.0.0.3"} {
		held = append(held, dialFrom(t, src, f.gw))
	}
	require.Eventually(t, func() bool { return f.b.Metrics()["proxy_operator_broker_gateway_connections"] == 12 }, 10*time.Second, 20*time.Millisecond)
	resp = refusedOnAccept(t, dialFrom(t, "127.0.0.4", f.gw))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Equal(t, "GATEWAY_BUSY", resp.Header.Get("X-Egress-Proxies-Reason"))
	assert.Equal(t, "capacity", resp.Header.Get("X-Egress-Proxies-Fault"))

	// The lease API is untouched by a full gateway.
	r := f.b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer "+gwToken)
	assert.Equal(t, http.StatusOK, r.Status)
	m := f.b.Metrics()
	assert.Equal(t, 1.0, m[`proxy_operator_broker_gateway_connections_refused_total{bound="source"}`])
	assert.Equal(t, 1.0, m[`proxy_operator_broker_gateway_connections_refused_total{bound="gateway"}`])

	// Freed, the gateway serves again.
	for _, c := range held {
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return f.b.Metrics()["proxy_operator_broker_gateway_connections"] == 0 }, 10*time.Second, 20*time.Millisecond)
	code, _, _ := get(t, f.client("", gwToken, false), f.echo.URL)
	assert.Equal(t, http.StatusOK, code)
}

// firehose is a TCP server on loopback that writes to each client
// without end: a download its client stops reading.
func firehose(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	chunk := make([]byte, 64<<10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				for {
					if _, err := c.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A client that stops reading a download does not hold its tunnel, and
// its lease, to the tunnel's timeout: once a write to it waits an idle
// timeout the tunnel ends, as stalled, and the lease is released.
func TestGatewayEndsATunnelWhoseClientStopsReading(t *testing.T) {
	f := newGatewayFleet(t, "--gateway-idle-timeout", "1s")
	c, _ := tunnel(t, f.gw, basic("", gwToken), firehose(t))
	// Not a byte is read from c: the kernel's buffers fill, then the
	// gateway's write waits.
	require.Eventually(t, func() bool {
		return f.b.Metrics()[`proxy_operator_broker_gateway_tunnel_ends_total{why="stalled"}`] == 1
	}, 30*time.Second, 100*time.Millisecond, "the stalled tunnel was not ended")
	f.waitNoLeases()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, c)
	assert.NoError(t, err, "the tunnel was closed (what was buffered drains, then EOF)")
}

// Removing a token from the file ends its tunnels at the next renewal,
// and frees their leases; another token's tunnels go on.
func TestGatewayRevokedTokenLosesItsTunnels(t *testing.T) {
	f := newGatewayFleet(t, "--gateway-lease-ttl", "3s", "--min-ttl", "3s")
	revoked, _ := tunnel(t, f.gw, basic("", otherToken), hostOf(f.echo.URL))
	kept, _ := tunnel(t, f.gw, basic("", gwToken), hostOf(f.echo.URL))
	require.NoError(t, os.WriteFile(f.tokenFile, []byte("crawlers:"+gwToken+"\n"), 0o600))
	// The file is re-read within 5 s, and the lease renewed each second.
	_ = revoked.SetReadDeadline(time.Now().Add(20 * time.Second))
	_, err := revoked.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the revoked token's tunnel was closed")
	m := f.b.Metrics()
	assert.Equal(t, 1.0, m[`proxy_operator_broker_gateway_tunnel_ends_total{why="revoked"}`])
	assert.Equal(t, 1.0, m[`proxy_operator_broker_gateway_renewals_total{result="revoked"}`])
	require.Eventually(t, func() bool { return f.liveLeases() == 1 }, 10*time.Second, 50*time.Millisecond, "the revoked tunnel's lease was released")

	// The other token's tunnel is alive: TLS through it still works.
	tc := tls.Client(kept, &tls.Config{RootCAs: f.echo.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, ServerName: "127.0.0.1"})
	require.NoError(t, tc.Handshake(), "the kept token's tunnel goes on")
	_ = tc.Close()
	f.waitNoLeases()
}

// hostOf is a URL's host:port.
func hostOf(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		panic(err)
	}
	return p.Host
}

// A token limited to the gateway (scope=gateway) crawls through it, but
// cannot call the lease API, whose leases carry every proxy's
// credentials: a gateway password read off a crawler's proxy URL is worth
// a proxy, not the fleet.
func TestGatewayOnlyTokenCannotCallTheAPI(t *testing.T) {
	f := newGatewayFleet(t)
	const gwOnly = "gateway-only-secret"
	require.NoError(t, os.WriteFile(f.tokenFile, []byte("crawlers:"+gwToken+"\ncrawl-gw:"+gwOnly+" scope=gateway\n"), 0o600))
	var r rest.Reply
	require.Eventually(t, func() bool {
		r = f.b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer "+gwOnly)
		return r.Status != http.StatusUnauthorized
	}, 15*time.Second, 100*time.Millisecond, "the token file was not re-read")
	assert.Equal(t, http.StatusForbidden, r.Status)
	assert.Contains(t, string(r.Body), `tenant \"crawl-gw\" (the token file): its credentials are for the proxy gateway (verbs: gateway, report): they cannot list`)

	c, err := leaseclient.Dial(f.b.GRPC, leaseclient.WithToken(gwOnly))
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.API().CreateLease(ctx, &leasev1.CreateLeaseRequest{TtlSeconds: 60})
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)

	code, body, _ := get(t, f.client("", gwOnly, false), f.echo.URL)
	assert.Equal(t, http.StatusOK, code, body)
	f.waitNoLeases()
}

// The gateway serves HTTPS proxy clients on --gateway-tls-addr with the
// broker's certificate: Go's client and curl (--proxy https://) crawl
// through it, the proxy password never in the clear; the plaintext port
// serves as before.
func TestGatewayOverTLS(t *testing.T) {
	ca, err := certs.NewCA("gateway test CA")
	require.NoError(t, err)
	files, err := ca.WriteServer(t.TempDir(), "127.0.0.1", "localhost")
	require.NoError(t, err)
	tlsGW := proc.Addr(proc.FreePort(t))
	f := newGatewayFleet(t, "--tls-cert-file", files.Cert, "--tls-key-file", files.Key, "--gateway-tls-addr", tlsGW)

	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(files.CA)
	require.NoError(t, err)
	require.True(t, pool.AppendCertsFromPEM(caPEM))
	pool.AddCert(f.echo.Certificate())
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "https", User: url.UserPassword("", gwToken), Host: tlsGW}),
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
	// The broker's REST port is TLS too: the fleet is leasable once a
	// tunnel opens.
	var code int
	var body string
	require.Eventually(t, func() bool {
		resp, err := c.Get(f.echo.URL)
		if err != nil {
			return false
		}
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		code, body = resp.StatusCode, string(b)
		return code == http.StatusOK
	}, 30*time.Second, 100*time.Millisecond, "nothing leasable through the TLS gateway")
	assert.Contains(t, []string{"127.0.8.1", "127.0.8.2"}, body, "the site saw a proxy")
	c.CloseIdleConnections() // the kept-alive tunnel ends, and its lease

	// A plaintext client on the TLS port gets no answer it could read.
	raw := dialFrom(t, "127.0.0.1", tlsGW)
	_, _ = fmt.Fprintf(raw, "CONNECT %s HTTP/1.1\r\n%s\r\n\r\n", hostOf(f.echo.URL), basic("", gwToken))
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = http.ReadResponse(bufio.NewReader(raw), nil)
	assert.Error(t, err)

	if curl, err := exec.LookPath("curl"); err == nil {
		sitePEM := filepath.Join(t.TempDir(), "site.pem")
		require.NoError(t, os.WriteFile(sitePEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: f.echo.Certificate().Raw}), 0o600))
		out, err := exec.Command(curl, "-sS", "--max-time", "20", "--proxy", "https://"+tlsGW, "--proxy-user", ":"+gwToken,
			"--proxy-cacert", files.CA, "--cacert", sitePEM, f.echo.URL).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Contains(t, []string{"127.0.8.1", "127.0.8.2"}, string(out))
	} else {
		t.Log("no curl on PATH: the HTTPS proxy is shown with Go's client only")
	}
	require.Eventually(t, func() bool {
		m := f.b.Metrics()
		return m["proxy_operator_broker_leases_created_total"] > 0 && m["proxy_operator_broker_leases_created_total"] == m["proxy_operator_broker_leases_released_total"]
	}, 10*time.Second, 50*time.Millisecond, "every lease the TLS gateway took is released")
}

// The gateway hands a proxy the address it checked, never the name: a
// plain-HTTP request rides a tunnel to that address, with its Host
// header, so a name that resolves elsewhere at the proxy (DNS rebinding)
// goes nowhere else; here the proxy's own resolver does not know the name
// at all. A CONNECT tries the name's other addresses when the proxy
// cannot reach the first, without blaming it; a name with '_' is served.
func TestGatewayGoesToTheCheckedAddress(t *testing.T) {
	dns := startDNS(t)
	f := newGatewayFleet(t, "--gateway-dns", dns.addr, "--gateway-retries", "0")
	var hosts atomic.Value
	named := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts.Store(r.Host)
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, "page for "+ip)
	}))
	t.Cleanup(named.Close)
	port := named.URL[strings.LastIndex(named.URL, ":")+1:]
	dns.set("rebind.test", netip.MustParseAddr("127.0.0.1"))
	dns.set("under_score.rebind.test", netip.MustParseAddr("127.0.0.1"))
	dead := netip.MustParseAddr("127.0.9.99") // nothing listens there
	dns.set("two.rebind.test", dead, netip.MustParseAddr("127.0.0.1"))

	for _, host := range []string{"rebind.test", "under_score.rebind.test"} {
		code, body, h := get(t, f.client("", gwToken, false), "http://"+host+":"+port+"/x")
		require.Equal(t, http.StatusOK, code, "%s: %s", host, body)
		assert.Equal(t, host+":"+port, hosts.Load(), "the site got the request as the client wrote it")
		assert.Equal(t, "page for "+squidHostOf(f, h), body)
	}
	for _, s := range f.squids {
		b, _ := os.ReadFile(s.AccessLog)
		assert.NotContains(t, string(b), "rebind.test", "no proxy was given the name")
	}

	before := f.b.Metrics()[`proxy_operator_broker_gateway_reports_total{kind="connect",result="error"}`]
	c, resp := tunnel(t, f.gw, basic("", gwToken), "two.rebind.test:"+port)
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: two.rebind.test\r\nConnection: close\r\n\r\n")
	page, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	b, _ := io.ReadAll(page.Body)
	assert.Equal(t, "page for "+squidHostOf(f, resp.Header), string(b))
	sq := squidOf(f, resp.Header)
	require.NotNil(t, sq, "the gateway named the proxy that served")
	sq.Logged("CONNECT "+dead.String()+":"+port, "CONNECT 127.0.0.1:"+port) // the first address was tried, then the second
	assert.Equal(t, before, f.b.Metrics()[`proxy_operator_broker_gateway_reports_total{kind="connect",result="error"}`], "the proxy was not blamed")
	_ = c.Close()
	f.waitNoLeases()
}

// squidHostOf is the address of the Squid that served an answer, by the
// proxy it names.
func squidHostOf(f *gwFleet, h http.Header) string {
	if s := squidOf(f, h); s != nil {
		return s.Host
	}
	return "no proxy named in " + h.Get("X-Egress-Proxies-Proxy")
}

// squidOf is the Squid behind the proxy a gateway answer names.
func squidOf(f *gwFleet, h http.Header) *proc.Squid {
	id := h.Get("X-Egress-Proxies-Proxy")
	for i, s := range f.squids {
		if strings.HasSuffix(id, fmt.Sprintf("/p%d", i)) {
			return s
		}
	}
	return nil
}

// An upload with Expect: 100-continue goes through: the site's 100
// reaches the client, which then sends its body, and the final answer
// follows; a site that answers before asking for the body gets no body,
// and its answer reaches the client.
func TestGatewayPassesExpectContinue(t *testing.T) {
	f := newGatewayFleet(t)
	var received atomic.Int64
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/refuse" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		received.Add(n)
		_, _ = fmt.Fprintf(w, "got %d bytes", n)
	}))
	t.Cleanup(site.Close)
	c := f.client("", gwToken, true)
	// The client waits for the 100 far longer than the test may take.
	c.Transport.(*http.Transport).ExpectContinueTimeout = 5 * time.Minute
	c.Timeout = 30 * time.Second
	body := strings.Repeat("u", 1<<20)
	post := func(path string) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, site.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Expect", "100-continue")
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	resp, got := post("/upload")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, fmt.Sprintf("got %d bytes", len(body)), got)

	received.Store(0)
	resp, _ = post("/refuse")
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode)
	assert.Zero(t, received.Load(), "the refused body was not sent")
	f.waitNoLeases()
}

// A request that finds every lease slot taken waits for one
// (--gateway-capacity-wait) rather than being refused: a client's last
// tunnel frees its slot a moment after the client moved on.
func TestGatewayWaitsForALeaseSlot(t *testing.T) {
	f := newGatewayFleet(t, "--lease-cap", "1", "--gateway-capacity-wait", "10s")
	to := hostOf(f.echo.URL)
	first, _ := tunnel(t, f.gw, basic("", gwToken), to)
	tunnel(t, f.gw, basic("", gwToken), to)
	go func() {
		time.Sleep(500 * time.Millisecond)
		_ = first.Close()
	}()
	_, resp := tunnel(t, f.gw, basic("", gwToken), to)
	assert.NotEmpty(t, resp.Header.Get("X-Egress-Proxies-Lease"), "the third tunnel got the first one's slot")
	assert.Equal(t, 1.0, f.b.Metrics()[`proxy_operator_broker_gateway_capacity_waits_total{outcome="leased"}`])
}
