package agent

import (
	"context"
	"fmt"
	"runtime"
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
// probes against 200 proxies fronted by 4 real Squids and an HTTPS target
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

	const phase = 5 * time.Second
	s := newScheduler(64)
	// Every proxy due every 50ms: the prober runs flat out, bounded by
	// its concurrency; the rate is what it sustains.
	s.apply(targets(200, addrs, tg.URL+"/ok", 50*time.Millisecond))
	out := make(chan *probev1.ProbeResult, 4096)
	ctx, cancel := context.WithTimeout(context.Background(), phase)
	n, failed := 0, 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case r := <-out:
				n++
				if !r.GetSuccess() {
					failed++
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	b.ResetTimer()
	cpu0, t0 := cpuTime(), time.Now()
	s.run(ctx, p, out)
	<-done
	elapsed, cpu := time.Since(t0), cpuTime()-cpu0
	cancel()
	b.StopTimer()
	if failed > n/100 {
		b.Fatalf("%d of %d probes failed", failed, n)
	}

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
