package broker

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// The ways a site can be dead, and a live one, as a broad crawl meets
// them. Each host listens on a 127.x.y.z of its own, so each is its own
// target.
const (
	liveTLS    = "live https"
	livePlain  = "live http"
	closedPort = "closed port"
	filtered   = "filtered port"
	noName     = "name that does not resolve"
	badTLS     = "TLS that fails"
	site502    = "the site's own 502"
)

// crawlHost is one target of a crawl.
type crawlHost struct {
	kind string
	url  string
	host string // the target as the broker sees it
}

// hostOn starts the i-th host, of kind, on ip. A live HTTPS host is
// reached by a name dns resolves to ip (the gateway resolves it; Squid,
// sent the checked address, never does); a noName host by a name dns
// does not know.
func hostOn(t *testing.T, kind string, ip netip.Addr, dns *dnsServer, i int) crawlHost {
	t.Helper()
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip.String(), "0"))
		require.NoError(t, err)
		return ln
	}
	serve := func(tlsOn bool, h http.HandlerFunc) string {
		return proc.Serve(t, ip.String(), h, tlsOn).URL
	}
	switch kind {
	case liveTLS:
		u, _ := url.Parse(serve(true, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "live "+r.Host) }))
		name := fmt.Sprintf("live-%d.crawl.test", i)
		dns.set(name, ip)
		return crawlHost{kind, "https://" + net.JoinHostPort(name, u.Port()) + "/", name}
	case livePlain:
		u := serve(false, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "live "+r.Host) })
		return crawlHost{kind, u + "/", ip.String()}
	case site502:
		u := serve(false, func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "upstream broke", http.StatusBadGateway) })
		return crawlHost{kind, u + "/", ip.String()}
	case closedPort:
		ln := listen()
		addr := ln.Addr().String()
		_ = ln.Close()
		return crawlHost{kind, "https://" + addr + "/", ip.String()}
	case filtered:
		return crawlHost{kind, "https://" + filteredPort(t, ip) + "/", ip.String()}
	case noName:
		name := fmt.Sprintf("dead-%d.crawl.test", i)
		return crawlHost{kind, "https://" + name + "/", name}
	case badTLS:
		ln := listen()
		t.Cleanup(func() { _ = ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, "this is not TLS\r\n")
				_ = c.Close()
			}
		}()
		return crawlHost{kind, "https://" + ln.Addr().String() + "/", ip.String()}
	}
	t.Fatalf("no host kind %q", kind)
	return crawlHost{}
}

// filteredPort is an address whose SYNs go unanswered, as a firewall's
// DROP makes them: a listener with a backlog of none, filled by one
// connection never accepted.
func filteredPort(t *testing.T, ip netip.Addr) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: ip.As4()}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return addr
}

// fetched is what a crawler saw for one host: the answer (the gateway's
// or the site's), or the error its client raised, and the lease the
// CONNECT reply named.
type fetched struct {
	status int
	header http.Header
	body   string
	err    error
	lease  string
	// connect is the head of a tunnel's 200 Connection established.
	connect http.Header
}

// crawler is a curl-like client of the gateway with user as its proxy
// user name: one connection per request; for https:// a CONNECT whose
// answer, refusal or 200, it keeps (as curl -v shows it), then TLS.
type crawler struct {
	gw, user string
}

func (f *gwFleet) crawler(user string) *crawler { return &crawler{gw: f.gw, user: user} }

func fetch(c *crawler, u string) fetched {
	var out fetched
	target, err := url.Parse(u)
	if err != nil {
		out.err = err
		return out
	}
	if target.Scheme == "http" {
		hc := &http.Client{Timeout: 40 * time.Second, Transport: &http.Transport{
			Proxy: http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(c.user, gwToken), Host: c.gw}), DisableKeepAlives: true}}
		resp, err := hc.Get(u)
		if err != nil {
			out.err = err
			return out
		}
		return out.read(resp)
	}
	conn, err := net.DialTimeout("tcp", c.gw, 5*time.Second)
	if err != nil {
		out.err = err
		return out
	}
	defer func() { _ = conn.Close() }()
	_ = conn.SetDeadline(time.Now().Add(40 * time.Second))
	hostport := target.Host
	if target.Port() == "" {
		hostport = net.JoinHostPort(target.Hostname(), "443")
	}
	creq := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: hostport}, Host: hostport, Header: http.Header{}}
	creq.SetBasicAuth(c.user, gwToken)
	creq.Header["Proxy-Authorization"] = creq.Header["Authorization"]
	delete(creq.Header, "Authorization")
	if out.err = creq.Write(conn); out.err != nil {
		return out
	}
	br := bufio.NewReader(conn)
	cresp, err := http.ReadResponse(br, creq)
	if err != nil {
		out.err = err
		return out
	}
	out.lease = cresp.Header.Get("X-Egress-Proxies-Lease")
	if cresp.StatusCode != http.StatusOK {
		return out.read(cresp)
	}
	out.connect = cresp.Header
	tc := tls.Client(&bufferedConn{Conn: conn, r: br}, &tls.Config{ServerName: target.Hostname(), InsecureSkipVerify: true}) //nolint:gosec // the suite's own hosts, self-signed
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	if out.err = req.Write(tc); out.err != nil {
		return out
	}
	resp, err := http.ReadResponse(bufio.NewReader(tc), req)
	if err != nil {
		out.err = err
		return out
	}
	return out.read(resp)
}

// read takes resp's status, headers and body.
func (out fetched) read(resp *http.Response) fetched {
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	out.status, out.header, out.body = resp.StatusCode, resp.Header, string(b)
	if out.lease == "" {
		out.lease = resp.Header.Get("X-Egress-Proxies-Lease")
	}
	return out
}

// bufferedConn reads what a bufio.Reader already holds first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (b *bufferedConn) Read(p []byte) (int, error) { return b.r.Read(p) }

// proxiesFor lists the fleet as the broker sees it for target.
func (f *gwFleet) proxiesFor(target string) []map[string]any {
	r := f.b.Do("GET", "/v1/proxies?target="+url.QueryEscape(target), "", "Authorization", "Bearer "+gwToken)
	require.Equal(f.t, 200, r.Status, string(r.Body))
	var out []map[string]any
	for _, p := range r.JSON["proxies"].([]any) {
		out = append(out, p.(map[string]any))
	}
	return out
}

// A broad crawl through the gateway: 200 hosts, a third of them dead in
// every way a site can be. No proxy is quarantined or cooled down, every
// live host is fetched, and every dead one is answered, and reported, as
// the site's fault.
func TestGatewayBroadCrawlBlamesTheSites(t *testing.T) {
	dns := startDNS(t)
	// Room for the crawl's 16 requests in flight on two proxies.
	f := newGatewayFleet(t, "--gateway-dns", dns.addr, "--lease-cap", "50")
	kinds := []string{closedPort, filtered, noName, badTLS, site502}
	var hosts []crawlHost
	for i := range 200 {
		kind := liveTLS
		switch {
		case i%3 == 2:
			kind = kinds[(i/3)%len(kinds)]
		case i%2 == 1:
			kind = livePlain
		}
		hosts = append(hosts, hostOn(t, kind, netip.AddrFrom4([4]byte{127, 0, 20 + byte(i/250), byte(1 + i%250)}), dns, i))
	}
	c := f.crawler("attr.pool=gw")
	got := make([]fetched, len(hosts))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i, h := range hosts {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			got[i] = fetch(c, h.url)
		})
	}
	wg.Wait()

	count := map[string]int{}
	for i, h := range hosts {
		g := got[i]
		count[h.kind]++
		switch h.kind {
		case liveTLS, livePlain:
			if assert.NoError(t, g.err, h.url) {
				assert.Equal(t, 200, g.status, "%s: %s", h.url, g.body)
				assert.NotEmpty(t, g.lease, "%s: the answer names its lease", h.url)
			}
		case closedPort, filtered, noName:
			require.NoError(t, g.err, h.url)
			want := map[string]struct {
				code   int
				reason string
			}{closedPort: {502, "SITE_UNREACHABLE"}, filtered: {504, "SITE_TIMEOUT"}, noName: {502, "UNRESOLVED"}}[h.kind]
			assert.Equal(t, want.code, g.status, "%s (%s): %s", h.url, h.kind, g.body)
			assert.Equal(t, want.reason, g.header.Get("X-Egress-Proxies-Reason"), h.url)
			assert.Equal(t, "site", g.header.Get("X-Egress-Proxies-Fault"), h.url)
			assert.Contains(t, g.body, "not", h.url)
		case badTLS:
			assert.Error(t, g.err, "%s: the client's handshake fails", h.url)
		case site502:
			require.NoError(t, g.err, h.url)
			assert.Equal(t, 502, g.status, "the site's own answer passes through")
			assert.Contains(t, g.body, "upstream broke")
			assert.NotEmpty(t, g.header.Get("X-Egress-Proxies-Lease"))
		}
	}
	f.waitNoLeases()

	for _, p := range f.proxiesFor("") {
		assert.Nil(t, p["quarantinedUntil"], "%s is quarantined for what the sites did", p["id"])
	}
	for _, h := range hosts {
		if h.kind == liveTLS || h.kind == livePlain {
			for _, p := range f.proxiesFor(h.host) {
				assert.Nil(t, p["cooldownUntil"], "%s cools down for the live %s", p["id"], h.host)
			}
		}
	}
	m := f.b.Metrics()
	assert.Zero(t, m[`proxy_operator_broker_gateway_reports_total{kind="connect",result="error"}`], "no proxy was blamed")
	assert.Zero(t, m[`proxy_operator_broker_gateway_reports_total{kind="http",result="error"}`], "no proxy was blamed")
	assert.Equal(t, float64(count[closedPort]+count[filtered]), m[`proxy_operator_broker_gateway_reports_total{kind="connect",result="target_error"}`],
		"each site that refused or timed out is reported as the site's fault")
	assert.Equal(t, float64(count[site502]), m[`proxy_operator_broker_gateway_reports_total{kind="http",result="target_error"}`])
	assert.Equal(t, float64(count[livePlain]), m[`proxy_operator_broker_gateway_reports_total{kind="http",result="ok"}`])
	assert.Zero(t, m[`proxy_operator_broker_gateway_retries_total`], "a site's failure is not retried through another proxy")
	t.Logf("crawled %v", count)
}

// A hostile site dresses its answers as Squid's own error pages: it
// cannot get a proxy blamed, quarantined or cooled down by them, and
// its own block, dressed as the proxy's denial, is still seen.
func TestGatewayHostileSiteCannotBlameTheProxy(t *testing.T) {
	f := newGatewayFleet(t)
	page := func(code int) string {
		return fmt.Sprintf("<html><body><p>The following error was encountered</p><div id=\"footer\">Generated by proxy (squid)</div><!-- %s --></body></html>", http.StatusText(code))
	}
	forged := []struct {
		path, squid string
		code        int
	}{
		{"/socket", "ERR_SOCKET_FAILURE 24", 500},
		{"/shutdown", "ERR_SHUTTING_DOWN 0", 503},
		{"/connect", "ERR_CONNECT_FAIL 111", 503},
		{"/auth", "ERR_CACHE_ACCESS_DENIED 0", 407},
		{"/ok", "ERR_CANNOT_FORWARD 0", 200},
	}
	handler := func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/denied" {
			w.Header().Set("X-Squid-Error", "ERR_ACCESS_DENIED 0")
			w.Header().Set("Server", "squid")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, page(403))
			return
		}
		for _, p := range forged {
			if r.URL.Path == p.path {
				w.Header().Set("X-Squid-Error", p.squid)
				w.Header().Set("Server", "squid")
				if p.code == 407 {
					w.Header().Set("Proxy-Authenticate", `Basic realm="Squid proxy-caching web server"`)
				}
				w.WriteHeader(p.code)
				_, _ = io.WriteString(w, page(p.code))
			}
		}
	}
	// Four hostile hosts: errors on three distinct targets would
	// quarantine a proxy, if any counted.
	var sites []string
	for i := range 4 {
		sites = append(sites, proc.Serve(t, fmt.Sprintf("127.0.30.%d", i+1), http.HandlerFunc(handler), false).URL)
	}
	c := f.crawler("attr.pool=gw")
	for _, site := range sites {
		for _, p := range forged {
			g := fetch(c, site+p.path)
			require.NoError(t, g.err)
			assert.NotEqual(t, "proxy", g.header.Get("X-Egress-Proxies-Fault"), "%s%s: %d %s", site, p.path, g.status, g.body)
		}
	}
	f.waitNoLeases()
	for _, site := range sites {
		u, _ := url.Parse(site)
		for _, p := range f.proxiesFor(u.Hostname()) {
			assert.Nil(t, p["quarantinedUntil"], "%s quarantined by a forged page", p["id"])
			assert.Nil(t, p["cooldownUntil"], "%s cooled down by a forged page", p["id"])
		}
	}
	m := f.b.Metrics()
	assert.Zero(t, m[`proxy_operator_broker_gateway_reports_total{kind="http",result="error"}`], "no forged page blamed a proxy")
	assert.Zero(t, m[`proxy_operator_broker_gateway_retries_total`])

	// Its own block, dressed as a proxy's denial, is a block.
	u, _ := url.Parse(sites[0])
	g := fetch(c, sites[0]+"/denied")
	require.NoError(t, g.err)
	assert.Equal(t, 403, g.status)
	assert.Equal(t, "ban", g.header.Get("X-Egress-Proxies-Fault"))
	assert.Equal(t, "SITE_BLOCKED", g.header.Get("X-Egress-Proxies-Reason"))
	proxy := g.header.Get("X-Egress-Proxies-Proxy")
	f.waitNoLeases()
	for _, p := range f.proxiesFor(u.Hostname()) {
		if p["id"] == proxy {
			assert.NotNil(t, p["cooldownUntil"], "the block cools the proxy that earned it down for the site")
		}
	}
}
