package proxypool_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxypool"
)

// BenchmarkPoolBringUp: a ProxyPool of N members (POOL_N, default 1,000)
// against its baseline, N Proxies created directly by 32 writers, in the
// same run, each in a namespace of its own through the same lifecycle
// reconciler (the fake provider, so instances run at once) and stand-in
// prober: the time until all N are Ready and Healthy, and the pool's as a
// ratio to the baseline's.
// `make bench-pool` runs it.
func BenchmarkPoolBringUp(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("POOL_N")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	direct := func() time.Duration {
		return bringUp(b, n, func(h *harness) {
			g, gctx := errgroup.WithContext(ctx)
			g.SetLimit(32)
			for i := range n {
				g.Go(func() error {
					return env.Client.Create(gctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("px-%05d", i), Namespace: h.ns},
						Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "fake", Port: 3128, Attributes: map[string]string{"geo": "eu"}}})
				})
			}
			if err := g.Wait(); err != nil {
				b.Fatal(err)
			}
		})
	}
	pooled := func() time.Duration {
		return bringUp(b, n, func(h *harness) {
			p := h.pool("bench", int32(n))
			p.Spec.Template.Spec.Provider = "fake"
			h.create(p)
		})
	}
	for range b.N {
		// Baseline, pool, baseline: each run leaves N objects behind in
		// the API server, so a later run works on a bigger etcd; the pool
		// is compared with the mean of the runs on either side of it.
		d1 := direct()
		p := pooled()
		d2 := direct()
		base := (d1 + d2) / 2
		fmt.Printf("[pool] %d Proxies created directly (32 writers): all Ready and Healthy in %s before the pool, %s after (baseline: their mean, %s)\n",
			n, d1.Round(time.Millisecond), d2.Round(time.Millisecond), base.Round(time.Millisecond))
		fmt.Printf("[pool] a ProxyPool of %d: all Ready and Healthy in %s, %.2f× the baseline\n", n, p.Round(time.Millisecond), p.Seconds()/base.Seconds())
		b.ReportMetric(base.Seconds(), "s-direct")
		b.ReportMetric(p.Seconds(), "s-pool")
		b.ReportMetric(p.Seconds()/base.Seconds(), "pool/direct")
	}
}

// bringUp runs a fresh harness, applies with apply, and returns how long
// until n Proxies of its namespace are Ready and Healthy.
func bringUp(b *testing.B, n int, apply func(*harness)) time.Duration {
	h := newHarness(b)
	h.opts = proxypool.Options{} // production's defaults
	h.start()
	defer func() { h.kill(); <-h.done }()
	start := time.Now()
	apply(h)
	for {
		list := &v1.ProxyList{}
		if err := env.Client.List(context.Background(), list, client.InNamespace(h.ns)); err != nil {
			b.Fatal(err)
		}
		up := 0
		for _, px := range list.Items {
			if px.Status.Phase == v1.PhaseReady && px.Status.Healthy {
				up++
			}
		}
		if up == n {
			return time.Since(start)
		}
		if time.Since(start) > 10*time.Minute {
			b.Fatalf("%d of %d up after 10 minutes", up, n)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
