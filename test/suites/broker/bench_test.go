package broker

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// BenchmarkLeases is `make bench-broker`: leases/s and latency over gRPC
// and REST against real broker processes and redis-server, at 100, 1,000
// and 10,000 matching proxies, with a 1% selector, with 30% of the fleet
// cooling down and 30% at the cap, and with ban-aware leasing (a target
// counted against a TargetPolicy's cap, a session key) against the same
// broker with --ban-aware=false; each figure is printed beside the
// baseline measured in the same run, a minimal gRPC handler running one
// small script on the same Redis.
func BenchmarkLeases(b *testing.B) {
	testenv.Require(b)
	ctx := context.Background()
	start := time.Now()
	fleet := makeFleets(b)
	b.Logf("fleet of %d Proxies ready in %s", 11100, time.Since(start).Round(time.Second))
	// A policy for the bench's target, so every ban-aware lease resolves it
	// and checks its cap, which is never reached.
	require.NoError(b, env.Client.Create(ctx, &v1.TargetPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "bench-10k", Name: "bench"},
		Spec: v1.TargetPolicySpec{Targets: []string{"example.com"}, MaxConcurrentLeases: ptr.To[int32](1_000_000)}}))
	r := proc.StartRedis(b, false)
	open := startBenchBroker(b, r, 0, store.DefaultPrefix)
	capped := startBenchBroker(b, r, benchCap, "{bench-cap}:")
	seed := startBenchBroker(b, r, benchCap, "{bench-seed}:", "--ban-aware=false")
	bases := startBaseline(b, r.Addr)
	base := bases.grpc

	grpcLease := func(api leasev1.LeaseServiceClient, req *leasev1.CreateLeaseRequest) func() error {
		return func() error { _, err := api.CreateLease(ctx, req); return err }
	}
	// leaseRelease keeps loads steady under the cap: each lease is handed
	// back at once, and a figure counts lease-and-release cycles.
	leaseRelease := func(api leasev1.LeaseServiceClient, req *leasev1.CreateLeaseRequest) func() error {
		return func() error {
			resp, err := api.CreateLease(ctx, req)
			if err != nil {
				return err
			}
			_, err = api.ReleaseLease(ctx, &leasev1.ReleaseLeaseRequest{LeaseId: resp.GetLeaseId()})
			return err
		}
	}
	// phaseOn measures call through bb on Redis rr; every figure but the
	// contended one starts from an empty store, so leases left by one
	// figure do not weigh on the next.
	phaseOn := func(bb *benchBroker, rr *proc.Redis, clients int, call func() error, fresh bool) benchRow {
		if fresh {
			flush := redis.NewClient(&redis.Options{Addr: rr.Addr})
			require.NoError(b, flush.FlushAll(ctx).Err())
			_ = flush.Close()
		}
		require.NoError(b, call()) // builds the selector's index
		pids := []int{os.Getpid(), rr.Proc.Cmd.Process.Pid, os.Getpid()}
		if bb != nil {
			pids[2] = bb.pid
		}
		before := cpuOf(b, pids...)
		rate, p50, p99 := drive(b, clients, call)
		after := cpuOf(b, pids...)
		row := benchRow{rate: rate, p50: p50, p99: p99}
		calls := time.Duration(rate * benchPhase.Seconds())
		row.cpu = [3]time.Duration{(after[0] - before[0]) / calls, (after[2] - before[2]) / calls, (after[1] - before[1]) / calls}
		if bb == nil {
			row.cpu[1] = 0
		}
		return row
	}
	phase := func(bb *benchBroker, call func() error, fresh bool) benchRow {
		return phaseOn(bb, r, benchClients, call, fresh)
	}
	restLease := func(url, body string) func() error {
		httpc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: benchClients}}
		return func() error {
			resp, err := httpc.Post(url+"/v1/leases", "application/json", strings.NewReader(body))
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != 200 {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			return nil
		}
	}

	// best keeps the faster of a figure's measurements: the headline
	// figures alternate with their baselines, best of two each, so a
	// neighbour's burst on this shared machine does not land on one side.
	best := func(r *benchRow, row benchRow) {
		if row.rate > r.rate {
			*r = row
		}
	}
	b.ResetTimer()
	var baseRow benchRow
	byFleet := map[int]benchRow{}
	for range 2 {
		best(&baseRow, phase(nil, grpcLease(base, &leasev1.CreateLeaseRequest{}), true))
		for _, f := range benchFleets {
			row := byFleet[f.n]
			best(&row, phase(open, grpcLease(open.api, &leasev1.CreateLeaseRequest{Namespace: f.ns, TtlSeconds: 600}), true))
			byFleet[f.n] = row
		}
	}
	baseRow.name = "baseline: gRPC unary + one 3-command script"
	rows := []benchRow{baseRow}
	for _, f := range benchFleets {
		row := byFleet[f.n]
		row.name = fmt.Sprintf("gRPC lease, %d matching proxies", f.n)
		row.vs, row.ratio, row.goal = "baseline", row.rate/baseRow.rate, "≥ 1.00, p99 ≤ 10 ms"
		byFleet[f.n] = row
		rows = append(rows, row)
	}
	// Batching concurrent leases into one script call must not cost a
	// lone client latency, nor stop paying off at other concurrencies:
	// the 1,000 at 1, 8 and 256 clients, each against the baseline at
	// the same concurrency.
	for _, clients := range []int{1, 8, 256} {
		var bl, row benchRow
		for range 2 {
			best(&bl, phaseOn(nil, r, clients, grpcLease(base, &leasev1.CreateLeaseRequest{}), true))
			best(&row, phaseOn(open, r, clients, grpcLease(open.api, &leasev1.CreateLeaseRequest{Namespace: "bench-1k", TtlSeconds: 600}), true))
		}
		row.name, row.vs, row.ratio = fmt.Sprintf("  same, %d clients", clients), fmt.Sprintf("baseline, %d clients", clients), row.rate/bl.rate
		rows = append(rows, row)
		if clients == 1 {
			rows = append(rows, benchRow{name: "  p50 at 1 client (p50 ratio)", rate: row.rate, p50: row.p50, p99: row.p99,
				vs: "baseline's p50, 1 client", ratio: float64(row.p50) / float64(bl.p50), cpu: row.cpu})
		}
	}
	flat := byFleet[10000]
	rows = append(rows, benchRow{name: "  flat in fleet size: 10,000 against 100", rate: flat.rate, p50: flat.p50, p99: flat.p99,
		vs: "100 proxies", ratio: flat.rate / byFleet[100].rate, goal: "≥ 0.85"})
	// REST against gRPC, and the transport's own share of the gap: the
	// baseline's handler behind the same gateway, and behind plain
	// net/http, against it over gRPC. All alternate, best of two each,
	// like the headline.
	var rest, grpc1k, gwBase, rawBase, grpcBase benchRow
	for range 2 {
		best(&grpcBase, phase(nil, grpcLease(base, &leasev1.CreateLeaseRequest{}), true))
		best(&gwBase, phase(nil, restLease(bases.gateway, `{}`), true))
		best(&rawBase, phase(nil, restLease(bases.raw, `{}`), true))
		best(&grpc1k, phase(open, grpcLease(open.api, &leasev1.CreateLeaseRequest{Namespace: "bench-1k", TtlSeconds: 600}), true))
		best(&rest, phase(open, restLease(open.rest, `{"namespace":"bench-1k","ttlSeconds":600}`), true))
	}
	rest.name, rest.vs, rest.ratio, rest.goal = "REST lease, 1,000 matching proxies", "gRPC lease, 1,000", rest.rate/grpc1k.rate, "≥ 0.70"
	gwBase.name, gwBase.vs, gwBase.ratio = "  baseline over REST (grpc-gateway)", "baseline over gRPC", gwBase.rate/grpcBase.rate
	rawBase.name, rawBase.vs, rawBase.ratio = "  baseline over plain net/http JSON", "baseline over gRPC", rawBase.rate/grpcBase.rate
	rows = append(rows, rest, gwBase, rawBase)
	rare := phase(open, grpcLease(open.api, &leasev1.CreateLeaseRequest{Namespace: "bench-10k", Selector: map[string]string{"tier": "rare"}, TtlSeconds: 600}), true)
	rare.name, rare.vs, rare.ratio, rare.goal = "gRPC lease, selector matching 1% of 10,000", "all 10,000", rare.rate/flat.rate, "≥ 0.80"
	rows = append(rows, rare)

	req := &leasev1.CreateLeaseRequest{Namespace: "bench-10k", Target: "example.com", TtlSeconds: 600}
	clean := phase(capped, leaseRelease(capped.api, req), true)
	clean.name, clean.vs, clean.ratio = fmt.Sprintf("gRPC lease+release, 10,000, cap %d, target set", benchCap), "baseline", clean.rate/baseRow.rate
	rows = append(rows, clean)
	// Ban-aware leasing against the seed's rule, on the same fleet and
	// requests, alternated so drift on a shared machine hits both alike;
	// each keeps its best of two.
	var off, on, sess benchRow
	for range 2 {
		best(&off, phase(seed, leaseRelease(seed.api, req), true))
		best(&on, phase(capped, leaseRelease(capped.api, req), true))
	}
	off.name, off.vs, off.ratio = "gRPC lease+release, 10,000, target set, --ban-aware=false", "baseline", off.rate/baseRow.rate
	on.name, on.vs, on.ratio, on.goal = "  same, ban-aware: target counted against its policy's cap", "ban-aware off", on.rate/off.rate, "≥ 0.85"
	var sessions atomic.Int64
	withSession := func() error {
		r := &leasev1.CreateLeaseRequest{Namespace: "bench-10k", Target: "example.com", TtlSeconds: 600, SessionKey: fmt.Sprint("s", sessions.Add(1)%1000)}
		return leaseRelease(capped.api, r)()
	}
	sess = phase(capped, withSession, true)
	sess.name, sess.vs, sess.ratio = "  same, with one of 1,000 session keys", "ban-aware off", sess.rate/off.rate
	rows = append(rows, off, on, sess)
	loadFleet(b, r, "{bench-cap}:", "example.com", fleet)
	loaded := phase(capped, leaseRelease(capped.api, req), false)
	loaded.name, loaded.vs, loaded.ratio, loaded.goal = "  same, 30% cooling down for the target, 30% at the cap", "clean", loaded.rate/clean.rate, "≥ 0.80"
	rows = append(rows, loaded)
	rows = append(rows, ownCooldowns(b, r, fleet, "example.com", loaded, func(bb *benchBroker) benchRow {
		return phase(bb, leaseRelease(bb.api, req), false)
	})...)
	rows = append(rows, selectorChurn(b, r, phase)...)
	// Last, so neither the extra brokers and Redises nor the slow
	// clients' leftovers weigh on the figures above.
	rows = append(rows, durability(b, byFleet[1000], func(bb *benchBroker, rr *proc.Redis) benchRow {
		return phaseOn(bb, rr, benchClients, grpcLease(bb.api, &leasev1.CreateLeaseRequest{Namespace: "bench-1k", TtlSeconds: 600}), true)
	})...)
	// A page of 100 of the 10,000, as a dashboard or a client cache reads
	// it, against the unary baseline; then the watch's fan-out.
	page := phase(open, func() error {
		resp, err := open.api.ListProxies(ctx, &leasev1.ListProxiesRequest{Namespace: "bench-10k", PageSize: 100})
		if err == nil && len(resp.GetProxies()) != 100 {
			err = fmt.Errorf("a page of %d proxies, want 100", len(resp.GetProxies()))
		}
		return err
	}, false)
	page.name, page.vs, page.ratio = "gRPC ListProxies, a page of 100 of 10,000 (calls/s)", "baseline", page.rate/baseRow.rate
	rows = append(rows, page)
	rows = append(rows, watchFanOut(b, open)...)
	// A thousand clients that take and never give, open through the
	// figure: slowloris heads on REST, silent and stream-hoarding gRPC
	// connections (the broker's default limits cut them).
	slow := openSlowClients(b, open.rest[len("http://"):], open.grpc, 450, 5, 20)
	attacked := phase(open, grpcLease(open.api, &leasev1.CreateLeaseRequest{Namespace: "bench-1k", TtlSeconds: 600}), true)
	attacked.name, attacked.vs, attacked.goal = "gRPC lease, 1,000, with 1,000 slow clients open (p99 ratio)", "p99, none open", "≤ 2.0"
	attacked.ratio = float64(attacked.p99) / float64(byFleet[1000].p99)
	rows = append(rows, attacked)
	slow.close()
	b.StopTimer()

	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "\t%d clients, %s per figure\tleases/s\tp50\tp99\tratio\tto\tgoal\tCPU/call: bench\tbroker\tredis\t\n", benchClients, benchPhase)
	for _, r := range rows {
		ratio := ""
		if r.vs != "" {
			ratio = fmt.Sprintf("%.2f", r.ratio)
		}
		fmt.Fprintf(w, "%s\t\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.name, r.rate, r.p50.Round(10*time.Microsecond), r.p99.Round(10*time.Microsecond), ratio, r.vs, r.goal,
			r.cpu[0].Round(time.Microsecond), r.cpu[1].Round(time.Microsecond), r.cpu[2].Round(time.Microsecond))
	}
	_ = w.Flush()
	b.ReportMetric(baseRow.rate, "baseline/s")
	b.ReportMetric(byFleet[1000].rate/baseRow.rate, "grpc/baseline")
	b.ReportMetric(float64(byFleet[1000].p99.Microseconds()), "grpc-p99-µs")
	b.ReportMetric(rest.ratio, "rest/grpc")
	b.ReportMetric(gwBase.ratio, "gateway/grpc-baseline")
	b.ReportMetric(flat.rate/byFleet[100].rate, "10k/100")
	b.ReportMetric(rare.rate/flat.rate, "1%-selector/all")
	b.ReportMetric(loaded.rate/clean.rate, "contended/clean")
	b.ReportMetric(on.rate/off.rate, "ban-aware/off")
}
