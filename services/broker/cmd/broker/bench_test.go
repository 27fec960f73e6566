package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

const (
	benchClients = 64
	benchProxies = 1000
	benchPhase   = 5 * time.Second
)

// drive runs call from benchClients goroutines for benchPhase and returns
// the rate and latency percentiles of successful calls.
func drive(b *testing.B, call func() error) (perSec float64, p50, p99 time.Duration) {
	var mu sync.Mutex
	var lat []time.Duration
	errs := 0
	deadline := time.Now().Add(benchPhase)
	var wg sync.WaitGroup
	for range benchClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := call(); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
					continue
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if errs > 0 {
		b.Fatalf("%d calls failed", errs)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(len(lat)) / benchPhase.Seconds(), lat[len(lat)/2], lat[len(lat)*99/100]
}

// BenchmarkLeases is `make bench-broker`: lease throughput and latency over
// gRPC and REST against a real broker process and redis-server with 1,000
// leasable proxies, and in the same run the ceiling: the same Lua script
// driven straight at Redis by the same number of clients.
func BenchmarkLeases(b *testing.B) {
	testenv.Require(b)
	ctx := context.Background()
	ns := "bench"
	_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	ids := make([]string, benchProxies)
	for i := range benchProxies {
		name := fmt.Sprintf("p%04d", i)
		ids[i] = ns + "/" + name
		ip := fmt.Sprintf("127.0.%d.%d", 100+i/250, i%250+1)
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &v1.Proxy{}); err == nil {
			continue // left from an earlier -count
		}
		env.ReadyProxy(b, ns, name, ip, 3128, nil, true)
	}
	r := proc.StartRedis(b, false)
	kc, err := env.WriteKubeconfig(b.TempDir())
	require.NoError(b, err)
	g, h, ops := proc.FreePort(b), proc.FreePort(b), proc.FreePort(b)
	p := proc.Start(b, "broker", proc.Build(b, pkgPath), "--kubeconfig", kc, "--namespace", ns, "--redis-addrs", r.Addr,
		"--lease-cap", "0", "--grpc-addr", proc.Addr(g), "--http-addr", proc.Addr(h), "--ops-addr", proc.Addr(ops), "--log-level", "warn")
	proc.WaitHTTP(b, p, "http://"+proc.Addr(ops)+"/readyz", 60*time.Second)
	rest := "http://" + proc.Addr(h)
	require.Eventually(b, func() bool {
		resp, err := http.Get(rest + "/v1/proxies?healthy=true")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return strings.Count(string(body), `"id"`) == benchProxies
	}, 60*time.Second, 200*time.Millisecond)

	conn, err := grpc.NewClient(proc.Addr(g), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	defer func() { _ = conn.Close() }()
	api := leasev1.NewLeaseServiceClient(conn)
	httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients}}

	b.ResetTimer()
	grpcRate, grpcP50, grpcP99 := drive(b, func() error {
		_, err := api.CreateLease(ctx, &leasev1.CreateLeaseRequest{TtlSeconds: 600})
		return err
	})
	restRate, restP50, restP99 := drive(b, func() error {
		resp, err := httpc.Post(rest+"/v1/leases", "application/json", strings.NewReader(`{"ttlSeconds":600}`))
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, PoolSize: benchClients})
	defer func() { _ = rdb.Close() }()
	st := store.New(rdb, store.DefaultPrefix)
	_ = ids
	ceilRate, ceilP50, ceilP99 := drive(b, func() error {
		_, err := st.Get(ctx, "x")
		return err
	})
	b.StopTimer()

	b.ReportMetric(grpcRate, "grpc-leases/s")
	b.ReportMetric(float64(grpcP50.Microseconds()), "grpc-p50-µs")
	b.ReportMetric(float64(grpcP99.Microseconds()), "grpc-p99-µs")
	b.ReportMetric(restRate, "rest-leases/s")
	b.ReportMetric(float64(restP50.Microseconds()), "rest-p50-µs")
	b.ReportMetric(float64(restP99.Microseconds()), "rest-p99-µs")
	b.ReportMetric(ceilRate, "redis-script-leases/s")
	b.ReportMetric(float64(ceilP50.Microseconds()), "redis-p50-µs")
	b.ReportMetric(float64(ceilP99.Microseconds()), "redis-p99-µs")
	b.ReportMetric(grpcRate/ceilRate, "grpc/ceiling")
	b.ReportMetric(restRate/ceilRate, "rest/ceiling")
}
