package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

const (
	loadClients  = 64
	loadPhase    = 2 * time.Second
	loadRounds   = 5
	loadDownload = 100 << 20
	// loadFlood is how many idle connections are attempted against the
	// gateway while the lease API's latency is measured.
	loadFlood = 20000
	// loadLeases is how many leases make each p99.
	loadLeases = 400
)

// loadSite is an HTTPS site with a small page and a 100 MiB download.
type loadSite struct {
	url   string
	roots *x509.CertPool
}

func startLoadSite(b *testing.B) loadSite {
	chunk := make([]byte, 1<<20)
	site := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/download" {
			w.Header().Set("Content-Length", strconv.Itoa(loadDownload))
			for range loadDownload / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
			return
		}
		_, _ = io.WriteString(w, "a page\n")
	}))
	site.StartTLS()
	b.Cleanup(site.Close)
	return loadSite{url: site.URL, roots: site.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs}
}

// newTunnels runs clients that each fetch the site's page on a new
// tunnel per request for d, and returns the requests per second served,
// and the failures by what they were.
func newTunnels(s loadSite, proxy *url.URL, clients int, d time.Duration) (float64, map[string]int) {
	var served atomic.Int64
	var mu sync.Mutex
	failed := map[string]int{}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				why := fetchOnce(s, proxy)
				if why == "" {
					served.Add(1)
					continue
				}
				mu.Lock()
				failed[why]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return float64(served.Load()) / d.Seconds(), failed
}

// fetchOnce fetches the page on a new tunnel: "" or why it failed (the
// status the proxy refused the tunnel with, or the error).
func fetchOnce(s loadSite, proxy *url.URL) string {
	why := ""
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: s.roots}, DisableKeepAlives: true,
		OnProxyConnectResponse: func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			if res.StatusCode != http.StatusOK {
				why = res.Status + " " + res.Header.Get("X-Egress-Proxies-Reason")
			}
			return nil
		}}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get(s.url)
	if err != nil {
		if why == "" {
			why = err.Error()
		}
		return why
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.Status
	}
	return ""
}

// download fetches the 100 MiB download through proxy on one tunnel and
// returns MiB/s.
func download(b *testing.B, s loadSite, proxy *url.URL) float64 {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: s.roots}}
	defer tr.CloseIdleConnections()
	start := time.Now()
	resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Minute}).Get(s.url + "/download")
	require.NoError(b, err)
	n, err := io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	require.NoError(b, err)
	require.EqualValues(b, loadDownload, n)
	return float64(n) / (1 << 20) / time.Since(start).Seconds()
}

// profileTop is the broker's CPU profile over d, as go tool pprof's top
// lines.
func profileTop(b *testing.B, g *gwBroker, d time.Duration, done chan<- string) {
	resp, err := http.Get(fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", g.pprof, int(d.Seconds())))
	if err != nil {
		done <- "profile: " + err.Error()
		return
	}
	defer func() { _ = resp.Body.Close() }()
	f := filepath.Join(b.TempDir(), "cpu.pprof")
	out, err := os.Create(f)
	if err == nil {
		_, err = io.Copy(out, resp.Body)
		_ = out.Close()
	}
	if err != nil {
		done <- "profile: " + err.Error()
		return
	}
	top, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=45", f).CombinedOutput()
	if err != nil {
		done <- "profile: " + err.Error()
		return
	}
	lines := strings.Split(string(top), "\n")
	for i, l := range lines {
		if strings.Contains(l, "flat%") {
			done <- strings.Join(lines[i:], "\n    ")
			return
		}
	}
	done <- string(top)
}

// startProxyChain starts proxy-chain (hack/bench/proxy-chain) in front of
// upstream, or says why it cannot.
func startProxyChain(b *testing.B, upstream string) (*url.URL, int, string) {
	dir := filepath.Join(testenv.RepoRoot(), "hack", "bench", "proxy-chain")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "proxy-chain")); err != nil {
		return nil, 0, "not installed (make bench-gateway installs it)"
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, 0, "no node on PATH"
	}
	addr := proc.Addr(proc.FreePort(b))
	p := proc.Start(b, "proxy-chain", node, filepath.Join(dir, "server.mjs"), addr, upstream)
	waitListening(b, addr)
	return &url.URL{Scheme: "http", Host: addr}, p.Cmd.Process.Pid, ""
}

// leaseP99 is the 99th percentile of n CreateLease calls over REST, each
// released.
func leaseP99(b *testing.B, g *gwBroker, token string, n int) time.Duration {
	auth := []string{"Authorization", "Bearer " + token}
	var took []time.Duration
	for range n {
		start := time.Now()
		r := rest.Do(b, "POST", g.rest+"/v1/leases", `{"selector":{"pool":"n8"},"ttlSeconds":60}`, auth...)
		took = append(took, time.Since(start))
		require.Equal(b, http.StatusOK, r.Status, string(r.Body))
		rest.Do(b, "DELETE", g.rest+"/v1/leases/"+r.JSON["leaseID"].(string), "", auth...)
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	return took[len(took)*99/100]
}

// serveFlood dials n connections to gw from 20 loopback addresses of
// net24 in turn, and holds them, sending nothing, until killed.
func serveFlood(gw, net24 string, n int) error {
	held := make([]net.Conn, 0, n)
	for i := range n {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("%s%d", net24, 100+i%20))}}
		c, err := d.Dial("tcp", gw)
		if err != nil {
			return err
		}
		held = append(held, c)
	}
	select {}
}

// BenchmarkGatewayLoad is `make bench-gateway`'s load half, as a new user
// meets the gateway: eight External Proxies of one namespace all pointing
// at one Squid, default caps (10 leases a proxy), the same HTTPS site.
// It prints, each way in alternating rounds of one run: requests/s with
// a new tunnel per request at 64 clients (straight Squid, a minimal
// chaining relay, proxy-chain, the gateway) and the gateway's refusals,
// with its CPU profile; a 100 MiB download through one tunnel; and the
// lease API's p99 while 20,000 idle connections are attempted against the
// gateway, against its p99 with none.
func BenchmarkGatewayLoad(b *testing.B) {
	testenv.Require(b)
	ns := env.Namespace(b, "gwload")
	net24 := fmt.Sprintf("127.10.%d.", os.Getpid()%250+1)
	sq := proc.StartSquidWithAuth(b, net24+"1", "squid-user", "pass-of-load")
	for i := range 8 {
		proxyOf(b, ns, fmt.Sprintf("n%d", i), sq, "pass-of-load", map[string]string{"pool": "n8"})
	}
	r := proc.StartRedis(b, false)
	tokenFile := filepath.Join(b.TempDir(), "tokens")
	const token = "bench-load-token"
	require.NoError(b, os.WriteFile(tokenFile, []byte("bench:"+token+"\n"), 0o600))
	g := startGatewayBroker(b, ns, r, tokenFile, "--gateway-max-conns", strconv.Itoa(loadFlood/2))
	require.Eventually(b, func() bool {
		ps, _ := rest.Do(b, "GET", g.rest+"/v1/proxies?pool=n8", "", "Authorization", "Bearer "+token).JSON["proxies"].([]any)
		return len(ps) == 8
	}, 60*time.Second, 100*time.Millisecond)
	s := startLoadSite(b)

	straight := &url.URL{Scheme: "http", User: url.UserPassword("squid-user", "pass-of-load"), Host: sq.Addr}
	via := &url.URL{Scheme: "http", User: url.UserPassword("attr.pool=n8", token), Host: g.gw}
	relayAddr := proc.Addr(proc.FreePort(b))
	relay := proc.StartEnv(b, "relay", []string{helperEnv + "=relay " + relayAddr + " " + sq.Addr + " squid-user pass-of-load"}, os.Args[0], "-test.run=^$")
	waitListening(b, relayAddr)
	// Each way, and the processes whose CPU it costs besides the clients,
	// the site and Squid (which every way shares).
	type way struct {
		name  string
		proxy *url.URL
		pids  []int
	}
	ways := []way{{"straight Squid", straight, nil}, {"minimal relay", &url.URL{Scheme: "http", Host: relayAddr}, []int{relay.Cmd.Process.Pid}}}
	chain, chainPid, why := startProxyChain(b, "http://squid-user:pass-of-load@"+sq.Addr)
	if chain != nil {
		ways = append(ways, way{"proxy-chain", chain, []int{chainPid}})
	}
	ways = append(ways, way{"gateway", via, []int{g.pid, r.Proc.Cmd.Process.Pid}})

	// Short rounds, many, alternating: the machine's drift falls on every
	// way alike, and each round is judged against straight Squid's next
	// to it.
	ratios := make([][]float64, len(ways))
	rates := make([]float64, len(ways))
	cpu := make([][]time.Duration, len(ways))
	served := make([]float64, len(ways))
	refused := map[string]int{}
	profile := make(chan string, 1)
	// The broker works only in the gateway's rounds: a profile over them
	// all is the gateway's.
	go profileTop(b, g, time.Duration(loadRounds*len(ways))*loadPhase, profile)
	for range loadRounds {
		var base float64
		for i, w := range ways {
			c0 := cpuOf(b, w.pids...)
			rate, failed := newTunnels(s, w.proxy, loadClients, loadPhase)
			c1 := cpuOf(b, w.pids...)
			if cpu[i] == nil {
				cpu[i] = make([]time.Duration, len(c0))
			}
			for j := range c0 {
				cpu[i][j] += c1[j] - c0[j]
			}
			served[i] += rate * loadPhase.Seconds()
			rates[i] += rate / loadRounds
			if i == 0 {
				base = rate
			}
			ratios[i] = append(ratios[i], rate/base)
			if w.proxy == via {
				for k, v := range failed {
					refused[k] += v
				}
			} else if len(failed) > 0 {
				b.Fatalf("%s failed: %v", w.name, failed)
			}
		}
	}
	var dl [2]float64
	for range 2 {
		dl[0] += download(b, s, straight) / 2
		dl[1] += download(b, s, via) / 2
	}

	// The lease API with and without a flood of idle connections at the
	// gateway (half held, at --gateway-max-conns; half refused on accept).
	quiet := leaseP99(b, g, token, loadLeases)
	var floods []*proc.Process
	for i := range 2 {
		floods = append(floods, proc.StartEnv(b, "flood", []string{fmt.Sprintf("%s=flood %s 127.12.%d. %d", helperEnv, g.gw, i+1, loadFlood/2)}, os.Args[0], "-test.run=^$"))
	}
	// Measured while the flood dials (on this machine its dialers take
	// CPU from everything else too), and while it holds what it got.
	dialing := leaseP99(b, g, token, loadLeases/2)
	require.Eventually(b, func() bool {
		m, err := promtext.Scrape(nil, g.ops+"/metrics")
		return err == nil && m["proxy_operator_broker_gateway_connections"]+m[`proxy_operator_broker_gateway_connections_refused_total{bound="gateway"}`] >= loadFlood
	}, 2*time.Minute, 200*time.Millisecond, "the flood's connections never all reached the gateway")
	held := leaseP99(b, g, token, loadLeases)
	m, err := promtext.Scrape(nil, g.ops+"/metrics")
	require.NoError(b, err)
	for _, f := range floods {
		f.Kill()
	}
	require.Eventually(b, func() bool {
		m, err := promtext.Scrape(nil, g.ops+"/metrics")
		return err == nil && m["proxy_operator_broker_gateway_connections"] == 0
	}, time.Minute, 200*time.Millisecond, "the flood's connections were never closed")
	quiet = max(quiet, leaseP99(b, g, token, loadLeases)) // before and after: the worse

	for i, w := range ways {
		sort.Float64s(ratios[i])
		perReq := ""
		switch len(w.pids) {
		case 1:
			perReq = fmt.Sprintf(", %.0f µs CPU a request", float64(cpu[i][0].Microseconds())/served[i])
		case 2:
			perReq = fmt.Sprintf(", %.0f µs CPU a request in the broker, %.0f µs in Redis", float64(cpu[i][0].Microseconds())/served[i], float64(cpu[i][1].Microseconds())/served[i])
		}
		fmt.Printf("gateway load new tunnel per request, %d clients: %s %.0f req/s %.2f (median of %d rounds; %.2f-%.2f)%s\n", loadClients, w.name, rates[i],
			ratios[i][len(ratios[i])/2], loadRounds, ratios[i][0], ratios[i][len(ratios[i])-1], perReq)
	}
	if chain == nil {
		fmt.Printf("  proxy-chain: %s\n", why)
	}
	total := 0
	for _, v := range refused {
		total += v
	}
	gw := served[len(served)-1]
	fmt.Printf("  gateway refused %d of %.0f tunnels (%.1f%%): %v\n", total, float64(total)+gw, 100*float64(total)/(float64(total)+gw), refused)
	fmt.Printf("  gateway CPU profile over its rounds:\n    %s\n", <-profile)
	fmt.Printf("gateway load 100 MiB through one tunnel %.0f MiB/s straight Squid %.0f MiB/s %.2f\n", dl[1], dl[0], dl[1]/dl[0])
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	fmt.Printf("gateway load lease API p99 with %d idle connections held %.2f ms, none (the worse of before and after) %.2f ms %.2f; while they are dialled %.2f ms %.2f (%.0f held, %.0f refused on accept)\n",
		loadFlood, ms(held), ms(quiet), float64(held)/float64(quiet), ms(dialing), float64(dialing)/float64(quiet),
		m["proxy_operator_broker_gateway_connections"], m[`proxy_operator_broker_gateway_connections_refused_total{bound="gateway"}`])
}

// basicToken is the Basic credentials of an empty user name and token.
func basicToken(token string) string {
	return strings.TrimPrefix(basic("", token), "Proxy-Authorization: Basic ")
}
