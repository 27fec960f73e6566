package broker

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

const (
	gwBenchClients = 64
	gwBenchPhase   = 4 * time.Second
	gwBenchBody    = 64 << 10
	gwTTFBSamples  = 200
	gwIdleTunnels  = 10000
	// gwLeaseTTL is the gateways' lease TTL: short, so the idle tunnels'
	// leases are renewed within the bench.
	gwLeaseTTL = 6 * time.Second
	// helperEnv makes this binary a helper process of the bench:
	// "sink <addr>", "relay <addr> <squid> <user> <password>" or
	// "flood <gateway> <source /24 prefix> <connections>".
	helperEnv = "EGRESS_PROXIES_GATEWAY_HELPER"
)

func runHelper(role string) int {
	f := strings.Fields(role)
	var err error
	switch {
	case len(f) == 2 && f[0] == "sink":
		err = serveSink(f[1])
	case len(f) == 5 && f[0] == "relay":
		err = serveRelay(f[1], f[2], proxyauth.Credentials{Username: f[3], Password: f[4]})
	case len(f) == 4 && f[0] == "flood":
		var n int
		if n, err = strconv.Atoi(f[3]); err == nil {
			err = serveFlood(f[1], f[2], n)
		}
	default:
		err = fmt.Errorf("unknown helper role %q", role)
	}
	fmt.Fprintln(os.Stderr, err)
	return 1
}

// serveSink accepts connections on addr and holds them, as a site would
// hold idle tunnels' connections, until the process is killed.
func serveSink(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	var held []net.Conn
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		held = append(held, c)
	}
}

// serveRelay is the throughput baseline: the least a hop between a
// client and Squid can do, and what the gateway does per tunnel without
// leasing, checking or reporting. It passes each CONNECT on to squid with
// creds, then splices the two connections as the gateway does.
func serveRelay(addr, squid string, creds proxyauth.Credentials) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer func() { _ = c.Close() }()
			br := bufio.NewReader(c)
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", squid)
			if err != nil {
				return
			}
			defer func() { _ = up.Close() }()
			out := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: req.Host}, Host: req.Host, Header: http.Header{}}
			creds.Authorize(out.Header)
			ubr := bufio.NewReader(up)
			if out.Write(up) != nil {
				return
			}
			if resp, err := http.ReadResponse(ubr, out); err != nil || resp.StatusCode != 200 {
				return
			}
			if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
				return
			}
			go func() {
				_, _ = io.Copy(up, io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c))
				_ = up.(*net.TCPConn).CloseWrite()
			}()
			_, _ = io.Copy(c, up)
		}()
	}
}

// waitListening waits until something accepts on addr.
func waitListening(b *testing.B, addr string) {
	require.Eventually(b, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "nothing listens on %s", addr)
}

// gwBroker is one broker process serving a gateway.
type gwBroker struct {
	gw, rest, ops, pprof string
	pid                  int
}

// uncapped are the flags of a gateway no cap may refuse a tunnel: one
// Squid takes every tunnel, 5,000 idle ones from one address.
var uncapped = []string{"--lease-cap", "0", "--target-lease-cap", "0", "--token-max-leases", "0", "--gateway-token-max-tunnels", "0",
	"--gateway-max-conns", "0", "--gateway-max-conns-per-source", "0", "--gateway-idle-timeout", "10m"}

func startGatewayBroker(b *testing.B, ns string, r *proc.Redis, tokenFile string, extra ...string) *gwBroker {
	kc, err := env.WriteKubeconfig(b.TempDir())
	require.NoError(b, err)
	g, h, ops, gw, pp := proc.FreePort(b), proc.FreePort(b), proc.FreePort(b), proc.FreePort(b), proc.FreePort(b)
	p := proc.Start(b, "broker", proc.Build(b, pkgPath), append([]string{"--kubeconfig", kc, "--namespace", ns, "--redis-addrs", r.Addr,
		"--grpc-addr", proc.Addr(g), "--http-addr", proc.Addr(h), "--ops-addr", proc.Addr(ops), "--log-level", "warn", "--pprof-bind-address", proc.Addr(pp),
		"--token-file", tokenFile, "--gateway-addr", proc.Addr(gw), "--egress-allowance-cidrs", proc.SuiteAllowance}, extra...)...)
	proc.WaitHTTP(b, p, "http://"+proc.Addr(ops)+"/readyz", 60*time.Second)
	return &gwBroker{gw: proc.Addr(gw), rest: "http://" + proc.Addr(h), ops: "http://" + proc.Addr(ops), pprof: "http://" + proc.Addr(pp), pid: p.Cmd.Process.Pid}
}

func (g *gwBroker) metric(b *testing.B, name string) float64 {
	m, err := promtext.Scrape(nil, g.ops+"/metrics")
	require.NoError(b, err)
	return m[name]
}

func (g *gwBroker) rss(b *testing.B) int64 {
	u, err := proc.ProcUsage(g.pid)
	require.NoError(b, err)
	return u.RSS
}

// BenchmarkGateway is `make bench-gateway`: the same HTTPS site fetched by
// 64 clients through one Squid, straight (the client speaks CONNECT to
// Squid itself, with its credentials) and through the gateway (which
// leases that Squid per tunnel), in alternating rounds of the same run;
// the time to first byte of new tunnels, both ways; the memory 10,000
// idle tunnels cost the gateways; and the leases they leave behind.
func BenchmarkGateway(b *testing.B) {
	testenv.Require(b)
	ns := env.Namespace(b, "gwbench")
	// Two proxies and two gateways: the idle tunnels need 20,000
	// descriptors on each side of a hop, and one process may hold at most
	// 20,000 here, so each gateway and each Squid carries half.
	// Addresses of this run's own: the last run's 20,000 connections may
	// still hold ports on the addresses it used.
	net24 := fmt.Sprintf("127.9.%d.", os.Getpid()%250+1)
	squids := []*proc.Squid{
		squidProxy(b, ns, "p0", net24+"1", map[string]string{"pool": "p0"}),
		squidProxy(b, ns, "p1", net24+"2", map[string]string{"pool": "p1"}),
	}
	r := proc.StartRedis(b, false)
	tokenFile := filepath.Join(b.TempDir(), "tokens")
	const token = "bench-gateway-token"
	require.NoError(b, os.WriteFile(tokenFile, []byte("bench:"+token+"\n"), 0o600))
	ttl := []string{"--gateway-lease-ttl", gwLeaseTTL.String(), "--min-ttl", gwLeaseTTL.String()}
	gws := []*gwBroker{startGatewayBroker(b, ns, r, tokenFile, append(ttl, uncapped...)...), startGatewayBroker(b, ns, r, tokenFile, append(ttl, uncapped...)...)}
	auth := []string{"Authorization", "Bearer " + token}
	require.Eventually(b, func() bool {
		ps, _ := rest.Do(b, "GET", gws[0].rest+"/v1/proxies", "", auth...).JSON["proxies"].([]any)
		return len(ps) == 2
	}, 60*time.Second, 100*time.Millisecond)

	body := make([]byte, gwBenchBody)
	_, _ = rand.Read(body)
	site := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
	site.StartTLS()
	b.Cleanup(site.Close)
	roots := site.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	straight := &url.URL{Scheme: "http", User: url.UserPassword("squid-user", "pass-of-p0"), Host: squids[0].Addr}
	via := &url.URL{Scheme: "http", User: url.UserPassword("attr.pool=p0", token), Host: gws[0].gw}
	transport := func(proxy *url.URL, keepAlive bool) *http.Transport {
		return &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: roots}, DisableKeepAlives: !keepAlive, MaxConnsPerHost: 1}
	}

	// Throughput: each client one kept-alive tunnel, fetching the body
	// over and over; rounds alternate so both ways see the same machine.
	throughput := func(proxy *url.URL) float64 {
		var bytes atomic.Int64
		var failed firstErr
		deadline := time.Now().Add(gwBenchPhase)
		var wg sync.WaitGroup
		for range gwBenchClients {
			wg.Go(func() {
				tr := transport(proxy, true)
				defer tr.CloseIdleConnections()
				c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
				for time.Now().Before(deadline) {
					resp, err := c.Get(site.URL)
					if err != nil {
						failed.set(err)
						return
					}
					n, _ := io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					bytes.Add(n)
				}
			})
		}
		wg.Wait()
		if err := failed.get(); err != nil {
			b.Fatalf("a fetch failed: %v", err)
		}
		return float64(bytes.Load()) / gwBenchPhase.Seconds() / (1 << 20)
	}
	relayAddr := proc.Addr(proc.FreePort(b))
	relay := proc.StartEnv(b, "relay", []string{helperEnv + "=relay " + relayAddr + " " + squids[0].Addr + " squid-user pass-of-p0"}, os.Args[0], "-test.run=^$")
	waitListening(b, relayAddr)
	viaRelay := &url.URL{Scheme: "http", Host: relayAddr}
	var directRate, gwRate, relayRate float64
	cpu := make([]time.Duration, 2) // the gateway's and the relay's
	for range 2 {
		directRate += throughput(straight) / 2
		c0 := cpuOf(b, gws[0].pid, relay.Cmd.Process.Pid)
		gwRate += throughput(via) / 2
		c1 := cpuOf(b, gws[0].pid, relay.Cmd.Process.Pid)
		relayRate += throughput(viaRelay) / 2
		c2 := cpuOf(b, gws[0].pid, relay.Cmd.Process.Pid)
		cpu[0] += c1[0] - c0[0]
		cpu[1] += c2[1] - c1[1]
	}

	// Time to first byte of a new tunnel (dial, CONNECT, TLS, GET), one
	// at a time, alternating.
	ttfb := func(proxy *url.URL) time.Duration {
		tr := transport(proxy, false)
		defer tr.CloseIdleConnections()
		var first time.Time
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }})
		req, _ := http.NewRequestWithContext(ctx, "GET", site.URL, nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		require.NoError(b, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return first.Sub(start)
	}
	var directT, gwT []time.Duration
	leaseSum := func() (float64, float64) {
		m, err := promtext.Scrape(nil, gws[0].ops+"/metrics")
		require.NoError(b, err)
		return m[`grpc_server_handling_seconds_sum{grpc_method="CreateLease",grpc_service="egressproxies.lease.v1.LeaseService",grpc_type="unary"}`],
			m[`grpc_server_handling_seconds_count{grpc_method="CreateLease",grpc_service="egressproxies.lease.v1.LeaseService",grpc_type="unary"}`]
	}
	s0, n0 := leaseSum()
	for range gwTTFBSamples {
		directT = append(directT, ttfb(straight))
		gwT = append(gwT, ttfb(via))
	}
	s1, n1 := leaseSum()
	p50 := func(d []time.Duration) float64 {
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return float64(d[len(d)/2].Microseconds()) / 1000
	}

	// The retry's cost: pool "r" is a healthy proxy and one whose Squid
	// is dead (its port refuses). A new tunnel's first lease lands on
	// the dead one whenever the healthy one still holds the last tunnel's
	// lease (nearly always, one tunnel right after another) and is retried
	// through the healthy one; its CONNECT answer says so
	// (X-Egress-Proxies-Attempts: 2). The errors are all on one target,
	// so the dead proxy is never quarantined. Each such sample alternates
	// with a new tunnel through a healthy proxy's pool, on the same gateway.
	dead := squidProxy(b, ns, "p-dead", net24+"3", map[string]string{"pool": "r"})
	dead.Kill()
	squidProxy(b, ns, "p-live", net24+"4", map[string]string{"pool": "r"})
	require.Eventually(b, func() bool {
		ps, _ := rest.Do(b, "GET", gws[0].rest+"/v1/proxies?pool=r", "", auth...).JSON["proxies"].([]any)
		return len(ps) == 2
	}, 60*time.Second, 100*time.Millisecond)
	viaRetry := &url.URL{Scheme: "http", User: url.UserPassword("attr.pool=r", token), Host: gws[0].gw}
	byAttempts := map[string][]time.Duration{}
	var healthyT []time.Duration
	for range gwTTFBSamples {
		healthyT = append(healthyT, ttfb(via))
		var attempts string
		tr := transport(viaRetry, false)
		tr.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, res *http.Response) error {
			attempts = res.Header.Get("X-Egress-Proxies-Attempts")
			return nil
		}
		var first time.Time
		ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }})
		req, _ := http.NewRequestWithContext(ctx, "GET", site.URL, nil)
		start := time.Now()
		resp, err := tr.RoundTrip(req)
		require.NoError(b, err, "the retry hides the dead proxy")
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		tr.CloseIdleConnections()
		byAttempts[attempts] = append(byAttempts[attempts], first.Sub(start))
	}
	require.NotEmpty(b, byAttempts["2"], "no tunnel's first lease was the dead proxy")

	// 10,000 idle tunnels, half on each gateway (through its own Squid),
	// all to one sink process.
	sinkAddr := fmt.Sprintf("%s9:%d", net24, proc.FreePort(b))
	proc.StartEnv(b, "sink", []string{helperEnv + "=sink " + sinkAddr}, os.Args[0], "-test.run=^$")
	waitListening(b, sinkAddr)
	open := func(g int) (net.Conn, error) {
		c, err := net.Dial("tcp", gws[g].gw)
		if err != nil {
			return nil, err
		}
		req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: sinkAddr}, Host: sinkAddr, Header: http.Header{}}
		req.SetBasicAuth(fmt.Sprintf("attr.pool=p%d", g), token)
		req.Header["Proxy-Authorization"] = req.Header["Authorization"]
		delete(req.Header, "Authorization")
		if err := req.Write(c); err != nil {
			_ = c.Close()
			return nil, err
		}
		resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64), req)
		if err == nil && resp.StatusCode != 200 {
			msg, _ := io.ReadAll(resp.Body)
			err = fmt.Errorf("CONNECT answered %s: %s", resp.Status, msg)
		}
		if err != nil {
			_ = c.Close()
			return nil, err
		}
		return c, nil
	}
	openAll := func(n int) []net.Conn {
		conns := make([]net.Conn, n)
		work := make(chan int)
		var failed firstErr
		var wg sync.WaitGroup
		for range gwBenchClients {
			wg.Go(func() {
				for i := range work {
					c, err := open(i % 2)
					if err != nil {
						failed.set(err)
						continue
					}
					conns[i] = c
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		if err := failed.get(); err != nil {
			b.Fatalf("opening idle tunnels: %v", err)
		}
		return conns
	}
	closeAll := func(conns []net.Conn) {
		for _, c := range conns {
			_ = c.Close()
		}
		for _, g := range gws {
			require.Eventually(b, func() bool { return g.metric(b, "proxy_operator_broker_gateway_tunnels") == 0 }, 60*time.Second, 100*time.Millisecond)
		}
	}
	// A first round warms both gateways' pools to the load; the second is
	// measured from the same start.
	closeAll(openAll(gwIdleTunnels / 10))
	before := gws[0].rss(b) + gws[1].rss(b)
	conns := openAll(gwIdleTunnels)
	require.Eventually(b, func() bool {
		return gws[0].metric(b, "proxy_operator_broker_gateway_tunnels")+gws[1].metric(b, "proxy_operator_broker_gateway_tunnels") == gwIdleTunnels
	}, 60*time.Second, 100*time.Millisecond)
	time.Sleep(2 * time.Second) // the tunnels' first read deadlines are set; nothing else moves
	after := gws[0].rss(b) + gws[1].rss(b)
	// Their leases (a gwLeaseTTL each) are renewed as they come due, a
	// third of the TTL old, in rounds: hold them through a few.
	r0 := renewalStats(b, gws[0])
	time.Sleep(2 * gwLeaseTTL)
	r1 := renewalStats(b, gws[0])
	closeAll(conns)
	pexpire := pexpireBaseline(b, r.Addr, gwIdleTunnels/2)

	// Every lease the gateways took is released: the API shows none live.
	live := 0
	for _, p := range rest.Do(b, "GET", gws[0].rest+"/v1/proxies", "", auth...).JSON["proxies"].([]any) {
		live += int(p.(map[string]any)["leaseCount"].(float64))
	}
	var created, released float64
	for _, g := range gws {
		created += g.metric(b, "proxy_operator_broker_leases_created_total")
		released += g.metric(b, "proxy_operator_broker_leases_released_total")
	}

	fmt.Printf("gateway throughput %.1f MiB/s direct %.1f MiB/s %.2f\n", gwRate, directRate, gwRate/directRate)
	fmt.Printf("  minimal CONNECT relay %.1f MiB/s direct %.1f MiB/s %.2f; gateway vs relay %.2f, CPU per GiB %.2f s vs %.2f s\n", relayRate, directRate, relayRate/directRate, gwRate/relayRate,
		cpu[0].Seconds()/(gwRate*2*gwBenchPhase.Seconds()/1024), cpu[1].Seconds()/(relayRate*2*gwBenchPhase.Seconds()/1024))
	fmt.Printf("gateway ttfb p50 %.2f ms direct %.2f ms\n", p50(gwT), p50(directT))
	fmt.Printf("  of which leasing (CreateLease in process, mean) %.2f ms\n", (s1-s0)/(n1-n0)*1000)
	fmt.Printf("gateway ttfb first proxy dead p50 %.2f ms healthy %.2f ms %.2f (%d of %d tunnels retried)\n",
		p50(byAttempts["2"]), p50(healthyT), p50(byAttempts["2"])/p50(healthyT), len(byAttempts["2"]), gwTTFBSamples)
	fmt.Printf("gateway idle tunnels %d %.1f KiB/tunnel\n", gwIdleTunnels, float64(after-before)/gwIdleTunnels/1024)
	renewed, seconds, rounds := r1.renewed-r0.renewed, r1.seconds-r0.seconds, r1.rounds-r0.rounds
	all := time.Duration(seconds / renewed * gwIdleTunnels / 2 * float64(time.Second))
	fmt.Printf("gateway renewal of %d tunnels' leases: %.0f renewed in %.0f rounds, %.0f ms a round; all at once would take %.0f ms of the %.0f ms budget (ttl/3), %.1f x a baseline of as many PEXPIREs, 64 at a time, %.0f ms; %.0f deferred, %.0f failed\n",
		gwIdleTunnels/2, renewed, rounds, seconds/rounds*1000, float64(all.Milliseconds()), float64((gwLeaseTTL / 3).Milliseconds()),
		float64(all)/float64(pexpire), float64(pexpire.Milliseconds()), r1.deferred-r0.deferred, r1.failed-r0.failed)
	fmt.Printf("gateway leaked leases %d\n", live+int(created-released))
	b.Logf("%d clients, %d KiB bodies, %s per round, two rounds each way; ttfb over %d new tunnels each way, one at a time; idle tunnels on two gateways (%d each), RSS %d -> %d MiB; leases created %.0f, released %.0f",
		gwBenchClients, gwBenchBody>>10, gwBenchPhase, gwTTFBSamples, gwIdleTunnels/2, before>>20, after>>20, created, released)
	if live != 0 || created != released {
		b.Fatalf("the gateways left %d leases live (created %.0f, released %.0f)", live, created, released)
	}
}

// renewals are a gateway's renewal counters.
type renewals struct{ renewed, deferred, failed, seconds, rounds float64 }

func renewalStats(b *testing.B, g *gwBroker) renewals {
	m, err := promtext.Scrape(nil, g.ops+"/metrics")
	require.NoError(b, err)
	return renewals{m[`proxy_operator_broker_gateway_renewals_total{result="renewed"}`], m[`proxy_operator_broker_gateway_renewals_total{result="deferred"}`],
		m[`proxy_operator_broker_gateway_renewals_total{result="failed"}`], m["proxy_operator_broker_gateway_renewal_round_seconds_sum"],
		m["proxy_operator_broker_gateway_renewal_round_seconds_count"]}
}

// pexpireBaseline is how long n PEXPIREs of as many keys take, 64 at a
// time from one client, on the same Redis: the least a round renewing n
// leases could cost.
func pexpireBaseline(b *testing.B, addr string, n int) time.Duration {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	defer func() { _ = rdb.Close() }()
	ctx := context.Background()
	for i := range n {
		require.NoError(b, rdb.Set(ctx, fmt.Sprintf("bench:pexpire:%d", i), "x", time.Minute).Err())
	}
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for range 64 {
		wg.Go(func() {
			for i := range work {
				_ = rdb.PExpire(ctx, fmt.Sprintf("bench:pexpire:%d", i), time.Minute).Err()
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return time.Since(start)
}
