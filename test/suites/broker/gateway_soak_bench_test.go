package broker

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// soakSample is one look at a broker during the soak.
type soakSample struct {
	at         time.Duration
	rss        int64
	goroutines float64
}

// BenchmarkGatewaySoak is `make bench-gateway SOAK=<duration>`: tunnels
// opened and closed at a steady rate for that long, a fifth of them by
// misbehaving clients (half-closed sockets, garbage heads, wrong
// passwords, readers that never read), with the broker's RSS and
// goroutines sampled throughout. It prints both over time and their slope
// over the second half, and fails if either grows.
func BenchmarkGatewaySoak(b *testing.B) {
	soak, err := time.ParseDuration(os.Getenv("EGRESS_PROXIES_SOAK"))
	if err != nil || soak <= 0 {
		b.Skip("EGRESS_PROXIES_SOAK (make bench-gateway SOAK=10m) sets how long the soak runs")
	}
	testenv.Require(b)
	ns := env.Namespace(b, "gwsoak")
	net24 := fmt.Sprintf("127.11.%d.", os.Getpid()%250+1)
	sq := proc.StartSquidWithAuth(b, net24+"1", "squid-user", "pass-of-soak")
	for i := range 2 {
		proxyOf(b, ns, fmt.Sprintf("s%d", i), sq, "pass-of-soak", nil)
	}
	r := proc.StartRedis(b, false)
	tokenFile := filepath.Join(b.TempDir(), "tokens")
	const token = "bench-soak-token"
	require.NoError(b, os.WriteFile(tokenFile, []byte("bench:"+token+"\n"), 0o600))
	g := startGatewayBroker(b, ns, r, tokenFile, "--gateway-idle-timeout", "2s", "--lease-cap", "0")
	require.Eventually(b, func() bool {
		ps, _ := rest.Do(b, "GET", g.rest+"/v1/proxies", "", "Authorization", "Bearer "+token).JSON["proxies"].([]any)
		return len(ps) == 2
	}, 60*time.Second, 100*time.Millisecond)
	s := startLoadSite(b)
	via := &url.URL{Scheme: "http", User: url.UserPassword("", token), Host: g.gw}
	siteHost := hostOf(s.url)

	misbehave := []func(){
		func() { // half-closed: the CONNECT, then nothing but a FIN
			c, err := net.Dial("tcp", g.gw)
			if err == nil {
				_, _ = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n", siteHost, basicToken(token))
				_ = c.(*net.TCPConn).CloseWrite()
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			}
		},
		func() { // a garbage head
			c, err := net.Dial("tcp", g.gw)
			if err == nil {
				_, _ = io.WriteString(c, "\x16\x03\x01\x02\x00garbage\r\n\r\n")
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			}
		},
		func() { // a wrong password
			_ = fetchOnce(s, &url.URL{Scheme: "http", User: url.UserPassword("", "not-the-token"), Host: g.gw})
		},
		func() { // a tunnel whose reader never reads: the download stalls
			c, err := net.Dial("tcp", g.gw)
			if err != nil {
				return
			}
			defer func() { _ = c.Close() }()
			_, _ = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nProxy-Authorization: Basic %s\r\n\r\n", siteHost, basicToken(token))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				return
			}
			tc := tls.Client(c, &tls.Config{RootCAs: s.roots, ServerName: "127.0.0.1"})
			_, _ = fmt.Fprintf(tc, "GET /download HTTP/1.1\r\nHost: %s\r\n\r\n", siteHost)
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = c.Read(make([]byte, 1)) // returns when the gateway ends it
		},
	}
	const rate = 50 // tunnels a second
	ctx, cancel := context.WithTimeout(context.Background(), soak)
	defer cancel()
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	var samples []soakSample
	start := time.Now()
	every := max(soak/24, time.Second)
	next := start
	for n := 0; ctx.Err() == nil; n++ {
		select {
		case <-ctx.Done():
		case <-tick.C:
			wg.Go(func() {
				if n%5 == 4 {
					misbehave[(n/5)%len(misbehave)]()
					return
				}
				_ = fetchOnce(s, via)
			})
		}
		if time.Now().After(next) {
			m, err := promtext.Scrape(nil, g.ops+"/metrics")
			require.NoError(b, err)
			samples = append(samples, soakSample{time.Since(start), g.rss(b), m["go_goroutines"]})
			next = next.Add(every)
		}
	}
	wg.Wait()
	fmt.Printf("gateway soak %s at %d tunnels/s, a fifth misbehaving:\n", soak, rate)
	for _, x := range samples {
		fmt.Printf("  %6.0fs rss %5.1f MiB goroutines %5.0f\n", x.at.Seconds(), float64(x.rss)/(1<<20), x.goroutines)
	}
	half := samples[len(samples)/2:]
	rssSlope := slope(half, func(x soakSample) float64 { return float64(x.rss) / (1 << 20) })
	gSlope := slope(half, func(x soakSample) float64 { return x.goroutines })
	// Growth is a slope that, over the second half, adds more than a
	// tenth of the second half's mean.
	grows := func(sl float64, f func(soakSample) float64) bool {
		mean := 0.0
		for _, x := range half {
			mean += f(x) / float64(len(half))
		}
		span := (half[len(half)-1].at - half[0].at).Minutes()
		return sl*span > 0.1*mean+1
	}
	verdict := func(g bool) string {
		if g {
			return "GROWS"
		}
		return "steady"
	}
	rssGrows, gGrows := grows(rssSlope, func(x soakSample) float64 { return float64(x.rss) / (1 << 20) }), grows(gSlope, func(x soakSample) float64 { return x.goroutines })
	fmt.Printf("gateway soak rss slope %+.2f MiB/min %s, goroutines slope %+.1f/min %s\n", rssSlope, verdict(rssGrows), gSlope, verdict(gGrows))
	if rssGrows || gGrows {
		b.Fatalf("the broker grows under the soak: rss %+.2f MiB/min, goroutines %+.1f/min", rssSlope, gSlope)
	}
}

// slope is the least-squares slope of f over the samples, per minute.
func slope(xs []soakSample, f func(soakSample) float64) float64 {
	var n, sx, sy, sxx, sxy float64
	for _, x := range xs {
		t := x.at.Minutes()
		y := f(x)
		n++
		sx += t
		sy += y
		sxx += t * t
		sxy += t * y
	}
	if d := n*sxx - sx*sx; d != 0 {
		return (n*sxy - sx*sy) / d
	}
	return 0
}
