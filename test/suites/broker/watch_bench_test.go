package broker

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// fanOutChanges is how many proxies of the 1,000 turn unhealthy while the
// watches are open.
const fanOutChanges = 100

// watchFanOut measures WatchProxies on the 1,000 with 100 watches open:
// the first set reaching every watch (the broker's CPU per event
// delivered, against its CPU per proxy when 100 clients list the 1,000
// instead), then
// fanOutChanges health changes reaching every watch (the broker's CPU per
// change, against one watch's: what 99 more watches add to a change).
func watchFanOut(b *testing.B, bb *benchBroker) []benchRow {
	listed := listAll(b, bb, 100)
	_, oneChange := fanOut(b, bb, 1)
	first, change := fanOut(b, bb, 100)
	first.name, first.vs = "WatchProxies, 100 watches of 1,000: first set, events/s (sync time)", "CPU/proxy, 100 lists"
	first.ratio = float64(first.cpu[1]) / float64(listed)
	change.name, change.vs = fmt.Sprintf("  then %d health changes, events/s (status write to each watch's event)", fanOutChanges), "CPU/change, 1 watch"
	change.ratio = float64(change.cpu[1]) / float64(oneChange.cpu[1])
	return []benchRow{first, change}
}

// listAll is the first set's baseline: the broker's CPU per proxy when n
// clients, 8 at a time, each list the 1,000 page by page.
func listAll(b *testing.B, bb *benchBroker, n int) time.Duration {
	cpu0 := cpuOf(b, bb.pid)[0]
	work := make(chan struct{}, n)
	for range n {
		work <- struct{}{}
	}
	close(work)
	var wg sync.WaitGroup
	var failed firstErr
	listed := 0
	var mu sync.Mutex
	for range 8 {
		wg.Go(func() {
			for range work {
				k := 0
				for _, err := range leaseclient.AllProxies(context.Background(), bb.api, &leasev1.ListProxiesRequest{Namespace: "bench-1k"}) {
					if err != nil {
						failed.set(err)
						return
					}
					k++
				}
				mu.Lock()
				listed += k
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := failed.get(); err != nil {
		b.Fatal(err)
	}
	return (cpuOf(b, bb.pid)[0] - cpu0) / time.Duration(listed)
}

// fanOut opens n watches, waits for each to sync, then turns
// fanOutChanges proxies unhealthy (and back, unmeasured) and waits for
// every watch to see each. Rows: events/s, p50/p99 of the time to sync
// (first) or from a status write to a watch's event (change), and the
// broker's CPU per event delivered (first) or per change (change).
func fanOut(b *testing.B, bb *benchBroker, n int) (first, change benchRow) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type watcher struct {
		synced time.Duration
		seen   map[string]time.Time // proxy id: when it came unhealthy
	}
	var mu sync.Mutex
	cond := sync.NewCond(&mu)
	ws := make([]*watcher, n)
	cpu0 := cpuOf(b, bb.pid)[0]
	start := time.Now()
	for i := range ws {
		w := &watcher{seen: map[string]time.Time{}}
		ws[i] = w
		stream, err := bb.api.WatchProxies(ctx, &leasev1.WatchProxiesRequest{Namespace: "bench-1k"})
		require.NoError(b, err)
		go func() {
			for {
				r, err := stream.Recv()
				if err != nil {
					return
				}
				now := time.Now()
				mu.Lock()
				for _, e := range r.GetEvents() {
					switch {
					case e.GetType() == leasev1.ProxyEvent_TYPE_SYNCED:
						w.synced = now.Sub(start)
					case w.synced > 0 && !e.GetProxy().GetHealthy():
						w.seen[e.GetProxy().GetId()] = now
					}
				}
				cond.Broadcast()
				mu.Unlock()
			}
		}()
	}
	waitAll := func(done func(*watcher) bool) {
		deadline := time.AfterFunc(2*time.Minute, func() { mu.Lock(); cond.Broadcast(); mu.Unlock() })
		defer deadline.Stop()
		t0 := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for {
			all := true
			for _, w := range ws {
				all = all && done(w)
			}
			if all {
				return
			}
			if time.Since(t0) > 2*time.Minute {
				b.Fatalf("%d watches: not every watch saw its events in 2 minutes", n)
			}
			cond.Wait()
		}
	}
	waitAll(func(w *watcher) bool { return w.synced > 0 })
	cpu1 := cpuOf(b, bb.pid)[0]
	var syncs []time.Duration
	for _, w := range ws {
		syncs = append(syncs, w.synced)
	}
	first = latencyRow(syncs, float64(n*1000)/time.Since(start).Seconds(), (cpu1-cpu0)/time.Duration(n*1000))

	setHealth := func(healthy bool) map[string]time.Time {
		written := map[string]time.Time{}
		for i := range fanOutChanges {
			var px v1.Proxy
			require.NoError(b, env.Client.Get(ctx, client.ObjectKey{Namespace: "bench-1k", Name: fmt.Sprintf("p%05d", i)}, &px))
			px.Status.Healthy = healthy
			require.NoError(b, env.Client.Status().Update(ctx, &px))
			written[px.Namespace+"/"+px.Name] = time.Now()
		}
		return written
	}
	t0 := time.Now()
	written := setHealth(false)
	waitAll(func(w *watcher) bool { return len(w.seen) == fanOutChanges })
	elapsed, cpu2 := time.Since(t0), cpuOf(b, bb.pid)[0]
	var lat []time.Duration
	mu.Lock()
	for _, w := range ws {
		for id, at := range w.seen {
			lat = append(lat, at.Sub(written[id]))
		}
	}
	mu.Unlock()
	change = latencyRow(lat, float64(n*fanOutChanges)/elapsed.Seconds(), (cpu2-cpu1)/fanOutChanges)
	setHealth(true)
	return first, change
}

func latencyRow(lat []time.Duration, rate float64, brokerCPU time.Duration) benchRow {
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return benchRow{rate: rate, p50: lat[len(lat)/2], p99: lat[len(lat)*99/100], cpu: [3]time.Duration{0, brokerCPU, 0}}
}
