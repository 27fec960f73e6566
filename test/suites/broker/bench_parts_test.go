package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

const (
	benchClients = 64
	benchPhase   = 5 * time.Second
	// benchCap is the capped broker's --lease-cap.
	benchCap = 20
	// rareEvery: one proxy in rareEvery of the 10,000 carries tier=rare.
	rareEvery = 100
)

// benchFleets are namespaces of leasable Proxies; the brokers watch all.
var benchFleets = []struct {
	ns string
	n  int
}{{"bench-100", 100}, {"bench-1k", 1000}, {"bench-10k", 10000}}

// drive runs call from clients goroutines for benchPhase and returns the
// rate and latency percentiles of the calls.
func drive(b *testing.B, clients int, call func() error) (perSec float64, p50, p99 time.Duration) {
	var mu sync.Mutex
	var lat []time.Duration
	var failed atomic.Int64
	var first firstErr
	deadline := time.Now().Add(benchPhase)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			local := make([]time.Duration, 0, 4096)
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := call(); err != nil {
					failed.Add(1)
					first.set(err)
					continue
				}
				local = append(local, time.Since(t))
			}
			mu.Lock()
			lat = append(lat, local...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d calls failed; the first: %v", n, first.get())
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(len(lat)) / benchPhase.Seconds(), lat[len(lat)/2], lat[len(lat)*99/100]
}

// firstErr keeps the first error of many goroutines (an atomic.Value
// panics when they are of different types).
type firstErr struct {
	mu  sync.Mutex
	err error
}

func (f *firstErr) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

func (f *firstErr) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// makeFleets creates the bench's Proxies (those an earlier -count made
// are kept) and returns the UIDs and addresses of the 10,000.
func makeFleets(b *testing.B) []store.Member {
	ctx := context.Background()
	for fi, f := range benchFleets {
		_ = env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}})
		var have v1.ProxyList
		require.NoError(b, env.Client.List(ctx, &have, client.InNamespace(f.ns)))
		exists := map[string]bool{}
		for _, p := range have.Items {
			exists[p.Name] = true
		}
		var missing []int
		for i := range f.n {
			if !exists[fmt.Sprintf("p%05d", i)] {
				missing = append(missing, i)
			}
		}
		err := createReady(f.ns, missing, func(i int) (string, string, map[string]string) {
			var attrs map[string]string
			if i%rareEvery == 0 {
				attrs = map[string]string{"tier": "rare"}
			}
			return fmt.Sprintf("p%05d", i), fmt.Sprintf("127.%d.%d.%d", 10+fi, i/250, i%250+1), attrs
		})
		require.NoError(b, err)
	}
	var big v1.ProxyList
	require.NoError(b, env.Client.List(ctx, &big, client.InNamespace(benchFleets[2].ns)))
	out := make([]store.Member, len(big.Items))
	for i, p := range big.Items {
		out[i] = store.Member{UID: string(p.UID), Namespace: p.Namespace, Addr: net.JoinHostPort(p.Spec.Address, fmt.Sprint(p.Spec.Port))}
	}
	return out
}

// createReady creates Ready, healthy External proxies in ns, one for each
// of which (its name, address and attributes), 16 at a time, as a fleet
// of thousands takes a while to write.
func createReady(ns string, which []int, of func(i int) (name, ip string, attrs map[string]string)) error {
	work := make(chan int)
	var wg sync.WaitGroup
	var failed firstErr
	for range 16 {
		wg.Go(func() {
			for i := range work {
				name, ip, attrs := of(i)
				if _, err := env.ReadyProxyE(ns, name, ip, 3128, attrs, true); err != nil {
					failed.set(err)
				}
			}
		})
	}
	for _, i := range which {
		work <- i
	}
	close(work)
	wg.Wait()
	return failed.get()
}

type benchBroker struct {
	api        leasev1.LeaseServiceClient
	rest, grpc string
	pid        int
}

// durability measures what each way of keeping an acknowledged lease
// costs, each on its own Redis and broker, against plain (no persistence):
// the chart's default (an append-only file fsynced every second: a crash
// of Redis loses up to a second of leases), fsync on every write (a crash
// loses none), and WAIT for a replica (a failover loses none).
func durability(b *testing.B, plain benchRow, measure func(*benchBroker, *proc.Redis) benchRow) []benchRow {
	everysec := proc.StartRedis(b, false, "--appendonly", "yes", "--appendfsync", "everysec")
	always := proc.StartRedis(b, true)
	primary := proc.StartRedis(b, false, "--appendonly", "yes", "--appendfsync", "everysec")
	proc.StartRedis(b, false, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port))
	rc := redis.NewClient(&redis.Options{Addr: primary.Addr})
	require.Eventually(b, func() bool {
		info, _ := rc.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online")
	}, 30*time.Second, 50*time.Millisecond, "the replica never caught up")
	_ = rc.Close()
	def := measure(startBenchBroker(b, everysec, 0, store.DefaultPrefix), everysec)
	def.name, def.vs, def.ratio = "gRPC lease, 1,000, AOF fsync every second (chart default)", "no persistence", def.rate/plain.rate
	all := measure(startBenchBroker(b, always, 0, store.DefaultPrefix), always)
	all.name, all.vs, all.ratio = "  same, AOF fsync always (redis.internal.appendfsync)", "fsync every second", all.rate/def.rate
	wait := measure(startBenchBroker(b, primary, 0, store.DefaultPrefix, "--redis-wait-replicas", "1", "--redis-wait-timeout", "1s"), primary)
	wait.name, wait.vs, wait.ratio = "  same, WAIT for 1 replica (broker.redisWaitReplicas)", "fsync every second", wait.rate/def.rate
	return []benchRow{def, all, wait}
}

func startBenchBroker(b *testing.B, r *proc.Redis, leaseCap int, prefix string, extra ...string) *benchBroker {
	kc, err := env.WriteKubeconfig(b.TempDir())
	require.NoError(b, err)
	g, h, ops := proc.FreePort(b), proc.FreePort(b), proc.FreePort(b)
	p := proc.Start(b, "broker", proc.Build(b, pkgPath), append([]string{"--kubeconfig", kc, "--redis-addrs", r.Addr, "--redis-key-prefix", prefix,
		"--lease-cap", fmt.Sprint(leaseCap), "--grpc-addr", proc.Addr(g), "--http-addr", proc.Addr(h), "--ops-addr", proc.Addr(ops), "--log-level", "warn"}, extra...)...)
	proc.WaitHTTP(b, p, "http://"+proc.Addr(ops)+"/readyz", 60*time.Second)
	// With a token file, the bench calls as its first line's tenant.
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	for i, a := range extra {
		if a == "--token-file" {
			lines, err := os.ReadFile(extra[i+1])
			require.NoError(b, err)
			opts = append(opts, auth.Static(strings.Split(strings.TrimSpace(string(lines)), "\n")...).DialOption())
		}
	}
	conn, err := grpc.NewClient(proc.Addr(g), opts...)
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close() })
	bb := &benchBroker{api: leasev1.NewLeaseServiceClient(conn), rest: "http://" + proc.Addr(h), grpc: proc.Addr(g), pid: p.Cmd.Process.Pid}
	total := 0
	for _, f := range benchFleets {
		total += f.n
	}
	require.Eventually(b, func() bool {
		listed := 0
		for _, err := range leaseclient.AllProxies(context.Background(), bb.api, &leasev1.ListProxiesRequest{}) {
			if err != nil {
				return false
			}
			listed++
		}
		return listed >= total
	}, 120*time.Second, 500*time.Millisecond, "the broker never listed the %d proxies", total)
	return bb
}

// selectorChurn is one tenant's lease p99 while another leases with a
// new selector in a loop (each an index to build, and past --max-indexes
// one to evict), with the selector budget (--token-max-selectors, 64 by
// default) and without it, against the same tenant's p99 alone. Both
// tenants are token-file lines of brokers of their own.
func selectorChurn(b *testing.B, r *proc.Redis, phase func(*benchBroker, func() error, bool) benchRow) []benchRow {
	ctx := context.Background()
	tokens := filepath.Join(b.TempDir(), "tokens")
	require.NoError(b, os.WriteFile(tokens, []byte("honest:honest-token\nchurn:churn-token\n"), 0o600))
	measure := func(bb *benchBroker, churn bool) benchRow {
		conn, err := grpc.NewClient(bb.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()), auth.Static("churn-token").DialOption())
		require.NoError(b, err)
		defer func() { _ = conn.Close() }()
		churner := leasev1.NewLeaseServiceClient(conn)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var churned, refused atomic.Int64
		if churn {
			for w := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						_, err := churner.CreateLease(ctx, &leasev1.CreateLeaseRequest{Namespace: "bench-1k", TtlSeconds: 600,
							Selector: map[string]string{"churn": fmt.Sprintf("%d-%d", w, i)}})
						churned.Add(1)
						if r, _ := leaseclient.Details(status.Convert(err)); r == "TENANT_SELECTOR_BUDGET" {
							refused.Add(1)
						}
					}
				}()
			}
		}
		row := phase(bb, func() error {
			_, err := bb.api.CreateLease(ctx, &leasev1.CreateLeaseRequest{Namespace: "bench-1k", TtlSeconds: 600})
			return err
		}, true)
		close(stop)
		wg.Wait()
		if churn {
			b.Logf("the churning tenant made %d leases with new selectors, %d refused past its budget", churned.Load(), refused.Load())
		}
		return row
	}
	budget := startBenchBroker(b, r, 0, "{bench-tenants}:", "--token-file", tokens, "--token-max-leases", "0")
	none := startBenchBroker(b, r, 0, "{bench-no-budget}:", "--token-file", tokens, "--token-max-leases", "0", "--token-max-selectors", "0")
	var alone, with, without benchRow
	for range 2 {
		if row := measure(budget, false); alone.p99 == 0 || row.p99 < alone.p99 {
			alone = row
		}
		if row := measure(budget, true); with.p99 == 0 || row.p99 < with.p99 {
			with = row
		}
		if row := measure(none, true); without.p99 == 0 || row.p99 < without.p99 {
			without = row
		}
	}
	alone.name, alone.vs, alone.ratio = "gRPC lease, 1,000, one tenant of two (p99 ratio)", "itself", 1
	with.name, with.vs, with.ratio, with.goal = "  same, the other leasing with a new selector in a loop (budget 64)", "alone", float64(with.p99)/float64(alone.p99), "≤ 1.5"
	without.name, without.vs, without.ratio = "  same, no selector budget (--token-max-selectors=0)", "alone", float64(without.p99)/float64(alone.p99)
	return []benchRow{alone, with, without}
}

// baseline is the minimal gRPC unary handler that runs one small Lua
// script on the same Redis: the ceiling a lease call can approach.
type baseline struct {
	leasev1.UnimplementedLeaseServiceServer
	rdb *redis.Client
}

var baselineScript = redis.NewScript(`local n = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], 'n', n)
redis.call('PEXPIRE', KEYS[2], 60000)
return n`)

func (s *baseline) CreateLease(ctx context.Context, _ *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	id := store.NewLeaseID()
	if err := baselineScript.Run(ctx, s.rdb, []string{"{base}:seq", "{base}:lease:" + id}).Err(); err != nil {
		return nil, err
	}
	return &leasev1.CreateLeaseResponse{LeaseId: id}, nil
}

// baselines are the baseline's handler behind each transport: gRPC;
// grpc-gateway's in-process handler over HTTP/1.1 JSON, as the broker's REST
// port serves it; and a plain net/http handler with encoding/json, the
// least any REST form of the call costs.
type baselines struct {
	grpc         leasev1.LeaseServiceClient
	gateway, raw string
}

func startBaseline(b *testing.B, redisAddr string) baselines {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	b.Cleanup(func() { _ = rdb.Close() })
	h := &baseline{rdb: rdb}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	srv := grpc.NewServer()
	leasev1.RegisterLeaseServiceServer(srv, h)
	go func() { _ = srv.Serve(ln) }()
	b.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close() })

	serve := func(handler http.Handler) string {
		hln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)
		hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(hln) }()
		b.Cleanup(func() { _ = hs.Close() })
		return "http://" + hln.Addr().String()
	}
	gw := runtime.NewServeMux()
	require.NoError(b, leasev1.RegisterLeaseServiceHandlerServer(context.Background(), gw, h))
	raw := http.NewServeMux()
	raw.HandleFunc("POST /v1/leases", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := h.CreateLease(r.Context(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"leaseId": resp.GetLeaseId()})
	})
	return baselines{grpc: leasev1.NewLeaseServiceClient(conn), gateway: serve(gw), raw: serve(raw)}
}

// ownCooldowns measures the contended lease (loadFleet's state, kept) as
// a tenant's pick runs it: a broker on the same prefix, called with a
// token-file tenant's credential, first with no cooldowns of the tenant's
// own, then with 10% of the fleet, drawn at random, cooling for it alone
// as an untrusted tenant's reports leave them (decision 127), so its pick
// counts a second cooling index.
func ownCooldowns(b *testing.B, r *proc.Redis, fleet []store.Member, target string, loaded benchRow, measure func(*benchBroker) benchRow) []benchRow {
	ctx := context.Background()
	tokens := filepath.Join(b.TempDir(), "tokens")
	require.NoError(b, os.WriteFile(tokens, []byte("crawler:crawler-token\n"), 0o600))
	bb := startBenchBroker(b, r, benchCap, "{bench-cap}:", "--token-file", tokens, "--token-max-leases", "0")
	none := measure(bb)

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer func() { _ = rdb.Close() }()
	st := store.New(rdb, "{bench-cap}:")
	shuffled := append([]store.Member(nil), fleet...)
	rand.New(rand.NewPCG(2, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	const private = `{"scope":"bench-own"}`
	require.NoError(b, st.Join(ctx, private, shuffled[:len(fleet)/10], []string{"bench-own"}))
	cooled := 0
	for ; ; cooled++ {
		l, err := st.Acquire(ctx, store.Acquire{Index: "bench-own", Target: target, TTL: time.Hour, LeaseID: store.NewLeaseID(), Caller: "crawler"})
		if _, ok := err.(*store.NoCandidateError); ok {
			break
		}
		require.NoError(b, err)
		v, err := st.Report(ctx, store.Report{LeaseID: l.ID, Owner: "crawler", Outcome: store.Blocked, Target: target, Policy: store.FixedCooldown(time.Hour)})
		require.NoError(b, err)
		require.Contains(b, v.Actions, store.ActionTenantOnly)
		_, err = st.Release(ctx, l.ID, "crawler")
		require.NoError(b, err)
	}
	require.NoError(b, st.Drop(ctx, "bench-own"))
	own := measure(bb)
	b.Logf("the tenant's own cooldowns: %d of the %d proxies", cooled, len(fleet))
	none.name, none.vs, none.ratio = "  same, called as a tenant (none of its own cooling)", "30% cooling", none.rate/loaded.rate
	own.name, own.vs, own.ratio, own.goal = "  same, 10% of the fleet drawn at random cooling for that tenant alone", "none of its own", own.rate/none.rate, "≥ 0.85"
	b.ReportMetric(own.rate/none.rate, "own-cooling/none")
	return []benchRow{none, own}
}

// loadFleet puts the capped broker's 10,000 in the contended state: 30%
// cooling down for target, 30% at the cap. It writes through the store
// on private indexes, as leases from other crawlers would.
func loadFleet(b *testing.B, r *proc.Redis, prefix, target string, fleet []store.Member) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer func() { _ = rdb.Close() }()
	st := store.New(rdb, prefix)
	shuffled := append([]store.Member(nil), fleet...)
	rand.New(rand.NewPCG(1, 1)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	third := len(fleet) * 3 / 10
	cooling, full := shuffled[:third], shuffled[third:2*third]
	// A scope no broker serves: a broker's resync adopts and repairs the
	// indexes of its own scope, and would fill these with all 11,100.
	const private = `{"scope":"bench-load"}`
	require.NoError(b, st.Join(ctx, private, cooling, []string{"bench-cool"}))
	require.NoError(b, st.Join(ctx, private, full, []string{"bench-full"}))
	var wg sync.WaitGroup
	var failed firstErr
	for range 16 {
		wg.Go(func() {
			for {
				_, err := st.Acquire(ctx, store.Acquire{Index: "bench-full", Cap: benchCap, TTL: time.Hour, LeaseID: store.NewLeaseID()})
				if err != nil {
					if _, ok := err.(*store.NoCandidateError); !ok {
						failed.set(err)
					}
					return
				}
			}
		})
		wg.Go(func() {
			for {
				l, err := st.Acquire(ctx, store.Acquire{Index: "bench-cool", Target: target, TTL: time.Hour, LeaseID: store.NewLeaseID()})
				if err != nil {
					if _, ok := err.(*store.NoCandidateError); !ok {
						failed.set(err)
					}
					return
				}
				if _, err := st.Report(ctx, store.Report{LeaseID: l.ID, Outcome: store.RateLimited, Target: target, Policy: store.FixedCooldown(time.Hour)}); err != nil {
					failed.set(err)
				}
				if _, err := st.Release(ctx, l.ID, ""); err != nil {
					failed.set(err)
				}
			}
		})
	}
	wg.Wait()
	if err := failed.get(); err != nil {
		b.Fatal(err)
	}
	require.NoError(b, st.Drop(ctx, "bench-cool"))
	require.NoError(b, st.Drop(ctx, "bench-full"))
}

type benchRow struct {
	name     string
	rate     float64
	p50, p99 time.Duration
	vs       string
	ratio    float64
	goal     string
	// CPU per call of the bench process (clients, and the baseline's
	// server), the broker and Redis.
	cpu [3]time.Duration
}

// cpuOf reads the CPU time of the given processes.
func cpuOf(b *testing.B, pids ...int) []time.Duration {
	out := make([]time.Duration, len(pids))
	for i, pid := range pids {
		u, err := proc.ProcUsage(pid)
		require.NoError(b, err)
		out[i] = u.CPU
	}
	return out
}
