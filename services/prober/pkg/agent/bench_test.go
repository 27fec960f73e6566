package agent

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/tlstarget"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func targets(n int, addrs []string, url string, every time.Duration) *probev1.Assignment {
	a := &probev1.Assignment{Full: true}
	for i := range n {
		addr := addrs[i%len(addrs)]
		var host string
		var port int32
		_, _ = fmt.Sscanf(addr, "127.0.0.1:%d", &port)
		host = "127.0.0.1"
		a.Upsert = append(a.Upsert, &probev1.ProbeTarget{Id: fmt.Sprintf("ns/p%05d", i), Uid: fmt.Sprint(i), Address: host, Port: port,
			Settings: &probev1.ProbeSettings{Url: url, ExpectedStatus: 204, Interval: durationpb.New(every), Timeout: durationpb.New(5 * time.Second)}})
	}
	return a
}

// BenchmarkProber is `make bench-prober`: one prober's scheduler and
// probes against 1,000 proxies fronted by 4 real Squids and an HTTPS target
// with its own CA (CONNECT + TLS + HTTP per probe, nothing reused), then
// the memory that 10,000 assigned proxies cost the scheduler.
func BenchmarkProber(b *testing.B) {
	proc.RequireProcesses(b)
	tg, err := tlstarget.Start("127.0.0.1:0", b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tg.Close() }()
	var addrs []string
	for range 4 {
		addrs = append(addrs, proc.StartSquid(b, "127.0.0.1", false).Addr)
	}
	p := &probe.Prober{RootCAs: tg.Pool()}

	// The prober and the minimal loop alternate, best of two each, so a
	// neighbour's burst on this shared machine does not land on one side.
	b.ResetTimer()
	var prober, loop phaseResult
	for range 2 {
		loop = loop.best(minimalLoop(b, addrs, tg))
		prober = prober.best(runProber(b, p, addrs, tg.URL+"/ok"))
	}
	b.StopTimer()
	n, elapsed, cpu, failed := prober.probes, prober.elapsed, prober.cpu, prober.failed
	fmt.Printf("prober vs minimal CONNECT loop %.0f/s %.0f/s %.2f\n", prober.rate(), loop.rate(), prober.rate()/loop.rate())
	fmt.Printf("  CPU per probe: prober %s, loop %s\n", (prober.cpu / time.Duration(prober.probes)).Round(time.Microsecond),
		(loop.cpu / time.Duration(loop.probes)).Round(time.Microsecond))

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	big := newScheduler(256)
	big.apply(targets(10000, addrs, tg.URL+"/ok", time.Hour))
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(big)

	b.ReportMetric(float64(n)/elapsed.Seconds(), "probes/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(n), "cpu-µs/probe")
	b.ReportMetric(float64(failed), "failed")
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB/10k-assigned")
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/10000, "B/assigned")
}

const (
	benchPhase       = 5 * time.Second
	benchConcurrency = 64
)

// phaseResult is one measured phase: probes that succeeded, failures, and
// the time and CPU they took.
type phaseResult struct {
	probes, failed int
	elapsed, cpu   time.Duration
}

func (r phaseResult) rate() float64 { return float64(r.probes) / r.elapsed.Seconds() }

func (r phaseResult) best(o phaseResult) phaseResult {
	if r.probes == 0 || o.rate() > r.rate() {
		return o
	}
	return r
}

// runProber runs one prober's scheduler flat out for a phase, bounded by
// its concurrency; the rate is what it sustains. 1,000 proxies due every
// 50 ms: a proxy is probed one at a time, so with a few per probe slot
// (200 for 64 slots) a slot waits for a due proxy whose last probe has
// ended, and the figure measured the schedule, not the prober.
func runProber(b *testing.B, p *probe.Prober, addrs []string, url string) phaseResult {
	s := newScheduler(benchConcurrency)
	s.apply(targets(1000, addrs, url, 50*time.Millisecond))
	out := make(chan *probev1.ProbeResult, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), benchPhase)
	defer cancel()
	var r phaseResult
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case res := <-out:
				r.probes++
				if !res.GetSuccess() {
					r.failed++
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	cpu0, t0 := cpuTime(), time.Now()
	s.run(ctx, p, out)
	<-done
	r.elapsed, r.cpu = time.Since(t0), cpuTime()-cpu0
	if r.failed > r.probes/100 {
		b.Fatalf("%d of %d probes failed", r.failed, r.probes)
	}
	r.probes -= r.failed
	return r
}

// minimalLoop is the least a probe can be, as the baseline: the same
// concurrency, Squids and target, and per probe a new connection, a
// CONNECT, a TLS handshake verifying the target (the prober's curves) and
// one GET, with nothing else: no scheduler, no policy checks, no result.
func minimalLoop(b *testing.B, addrs []string, tg *tlstarget.Target) phaseResult {
	u, err := url.Parse(tg.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg := &tls.Config{ServerName: u.Hostname(), RootCAs: tg.Pool(), MinVersion: tls.VersionTLS12, CurvePreferences: []tls.CurveID{tls.X25519, tls.CurveP256}}
	connect := "CONNECT " + u.Host + " HTTP/1.1\r\nHost: " + u.Host + "\r\n\r\n"
	get := "GET /ok HTTP/1.1\r\nHost: " + u.Host + "\r\nConnection: close\r\n\r\n"
	one := func(addr string) bool {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return false
		}
		defer func() { _ = c.Close() }()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, connect); err != nil {
			return false
		}
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != http.StatusOK {
			return false
		}
		tc := tls.Client(c, cfg)
		if _, err := io.WriteString(tc, get); err != nil {
			return false
		}
		resp, err = http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode == http.StatusNoContent
	}
	var ok, failed atomic.Int64
	deadline := time.Now().Add(benchPhase)
	cpu0, t0 := cpuTime(), time.Now()
	var wg sync.WaitGroup
	for i := range benchConcurrency {
		wg.Go(func() {
			for j := i; time.Now().Before(deadline); j++ {
				if one(addrs[j%len(addrs)]) {
					ok.Add(1)
				} else {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	r := phaseResult{probes: int(ok.Load()), failed: int(failed.Load()), elapsed: time.Since(t0), cpu: cpuTime() - cpu0}
	if r.failed > r.probes/100 {
		b.Fatalf("the minimal loop: %d of %d failed", r.failed, r.probes)
	}
	return r
}
