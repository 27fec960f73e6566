package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/assignment"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
)

// BenchmarkFleet is `make bench-fleet` (FLEET_N, FLEET_INTERVAL,
// FLEET_TIMEOUT): API server, controller, three probers, two brokers,
// Redis and four Squids on their own loopback addresses; N External
// Proxies created by 32 writers at once; then bring-up time, API writes,
// steady-state writes, memory and CPU, a SIGKILLed prober's share, and
// REST latency at that size.
func BenchmarkFleet(b *testing.B) {
	testenv.Require(b)
	n, interval, timeout := settings(b)
	const successThreshold = 2 // the controller's default, which the system keeps
	bound := time.Duration(successThreshold-1)*interval + timeout
	ctx := context.Background()
	out := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	say := func(format string, args ...any) { fmt.Printf("[fleet] "+format+"\n", args...) }

	say("starting the system: API server, Redis, controller, 3 probers, 2 brokers (health interval %s, timeout %s)", interval, timeout)
	s := system.Start(b, env, system.Options{Probers: 3, Brokers: 2, HealthInterval: interval, HealthTimeout: timeout,
		// The installed default lease, not the demo's 4 s one (kept short so
		// its failover is quick): a 10,000-proxy bring-up on two shared
		// cores held the API server's answers past the demo's 2.7 s renew
		// deadline, and the controller left with its leadership lost.
		ControllerArgs: append([]string{"--leader-election-lease-duration=15s"}, strings.Fields(os.Getenv("FLEET_CONTROLLER_ARGS"))...)})
	var squids []*proc.Squid
	for i := range 4 {
		squids = append(squids, proc.StartSquid(b, fmt.Sprintf("127.0.9.%d", i+1), false))
	}
	api, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	baselineBin := proc.Build(b, "github.com/egress-proxies/egress-proxies/test/suites/fleet/baseline")
	rows := []procRow{{"controller", s.Controllers[0].Proc.Cmd.Process.Pid, ""}}
	for i, p := range s.Probers {
		rows = append(rows, procRow{fmt.Sprintf("prober-%d", i), p.Cmd.Process.Pid, s.ProberOps[i]})
	}
	for i, br := range s.Brokers {
		rows = append(rows, procRow{fmt.Sprintf("broker-%d", i), br.Proc.Cmd.Process.Pid, ""})
	}
	// The parts the services run on, for where the rest of the CPU goes.
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if pid := childNamed(name); pid > 0 {
			rows = append(rows, procRow{"(part) " + name, pid, ""})
		}
	}
	for i, sq := range squids {
		rows = append(rows, procRow{fmt.Sprintf("(part) squid-%d", i), sq.Proc.Cmd.Process.Pid, ""})
	}
	rows = append(rows, procRow{"(part) this process: the probe target, the watch, the apply", os.Getpid(), ""})
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		b.Fatal(err)
	}

	w := &watcher{n: n, good: map[string]bool{}, steps: newSteps(), allGood: make(chan struct{})}
	// The watch's informer says what it has to (a watch restarted under
	// load) as a log line, not as controller-runtime's missing-logger stack.
	ctrllog.SetLogger(logr.FromSlogHandler(slog.Default().Handler()))
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		b.Fatal(err)
	}
	inf, err := c.GetInformer(ctx, &v1.Proxy{})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{AddFunc: w.see, UpdateFunc: func(_, o any) { w.see(o) }}); err != nil {
		b.Fatal(err)
	}
	cctx, stopCache := context.WithCancel(ctx)
	defer stopCache()
	go func() { _ = c.Start(cctx) }()
	c.WaitForCacheSync(cctx)

	usageOf := func() map[string]proc.Usage {
		m := map[string]proc.Usage{}
		for _, r := range rows {
			u, err := proc.ProcUsage(r.pid)
			if err != nil {
				b.Fatalf("%s: %v", r.name, err)
			}
			m[r.name] = u
		}
		return m
	}
	writes0, err := apiWrites(api, env.Config.Host)
	if err != nil {
		b.Fatal(err)
	}
	usage0 := usageOf()

	if dir := os.Getenv("FLEET_PROFILE"); dir != "" {
		// CPU profiles of the controller and a broker over the bring-up,
		// for whoever makes it faster next.
		for name, addr := range map[string]string{"controller": s.Controllers[0].Pprof, "broker-0": s.Brokers[0].Pprof} {
			go func() {
				path := dir + "/" + name + "-bringup.cpu.pprof"
				resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int((bound + 20*time.Second).Seconds())))
				if err != nil {
					say("profile: %v", err)
					return
				}
				defer func() { _ = resp.Body.Close() }()
				body, _ := io.ReadAll(resp.Body)
				if err := os.WriteFile(path, body, 0o644); err == nil {
					say("%s CPU profile: %s", name, path)
				}
			}()
		}
	}
	say("applying %d External Proxies (32 writers) fronting %d Squids", n, len(squids))
	b.ResetTimer()
	start := time.Now()
	pctx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	go w.steps.watchProbes(pctx, "http://"+s.Controllers[0].Metrics+"/metrics", interval/4)
	createErr := parallel(32, n, func(i int) error {
		sq := squids[i%len(squids)]
		name := fmt.Sprintf("px-%05d", i)
		err := env.Client.Create(ctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: sq.Host, Port: int32(sq.Port), Attributes: map[string]string{"geo": "local"}}})
		if err == nil {
			w.steps.mark(w.steps.created, name, time.Now())
		}
		return err
	})
	applied := time.Since(start)
	if createErr != nil {
		b.Fatalf("creating Proxies: %v", createErr)
	}
	say("applied in %s; waiting for all %d Ready and Healthy", applied.Round(time.Millisecond), n)

	limit := 5*bound + 5*time.Minute
	tick := time.NewTicker(5 * time.Second)
	deadline := time.After(limit)
wait:
	for {
		select {
		case <-w.allGood:
			break wait
		case <-tick.C:
			good, seen := w.count()
			say("  %s: %d of %d Ready and Healthy (%d seen)", time.Since(start).Round(time.Second), good, n, seen)
		case <-deadline:
			good, _ := w.count()
			b.Fatalf("only %d of %d proxies were Ready and Healthy after %s; logs: controller %s", good, n, limit, s.Controllers[0].Proc.LogPath)
		}
	}
	tick.Stop()
	bringUp := time.Since(start)
	b.StopTimer()
	stopProbes()
	usage1 := usageOf()
	ctrlMetrics, err := promtext.Scrape(nil, "http://"+s.Controllers[0].Metrics+"/metrics")
	if err != nil {
		b.Fatal(err)
	}
	writes1, err := apiWrites(api, env.Config.Host)
	if err != nil {
		b.Fatal(err)
	}
	say("all %d Ready and Healthy after %s", n, bringUp.Round(time.Millisecond))

	// The steady window: the fleet stays up and healthy; every Proxy write
	// in it is a write the transition-only design should not make.
	window := max(30*time.Second, 2*interval)
	say("steady window of %s", window)
	probes0, failed0 := map[string]float64{}, 0.0
	for _, r := range rows {
		if r.ops != "" {
			all, failed := proberProbes(b, r.ops)
			probes0[r.name] = all
			failed0 += failed
		}
	}
	// The informer baseline starts once the fleet is up, so it costs the
	// bring-up nothing; it holds the same N proxies by the window's end.
	informer := proc.Start(b, "baseline-informer", baselineBin, "informer", "--kubeconfig", s.Kubeconfig)
	time.Sleep(window)
	writes2, err := apiWrites(api, env.Config.Host)
	if err != nil {
		b.Fatal(err)
	}
	usage2 := usageOf()
	informerUsage, err := proc.ProcUsage(informer.Cmd.Process.Pid)
	if err != nil || !strings.Contains(informer.Log(), "synced") {
		b.Fatalf("the informer baseline did not sync (%v): %s", err, informer.Log())
	}
	assigned := map[string]float64{}
	probes := map[string]float64{}
	for _, r := range rows {
		if r.ops != "" {
			m, err := promtext.Scrape(nil, "http://"+r.ops+"/metrics")
			if err != nil {
				b.Fatal(err)
			}
			assigned[r.name] = m["proxy_operator_prober_assigned_targets"]
			all, _ := proberProbes(b, r.ops)
			probes[r.name] = all - probes0[r.name]
		}
	}

	// The baseline probe: the least a probe through these Squids to the
	// same target can cost, in a process of its own.
	var addrs []string
	for _, sq := range squids {
		addrs = append(addrs, sq.Addr)
	}
	bp := proc.Start(b, "baseline-probe", baselineBin, "probe", "--proxies", strings.Join(addrs, ","), "--url", s.Target.URL+"/ip", "--ca-file", s.Target.CAFile, "--n", "300")
	if code, err := bp.Wait(time.Minute); err != nil || code != 0 {
		b.Fatalf("baseline probes failed (%d, %v): %s", code, err, bp.Log())
	}
	var baseProbeUS int64
	if _, err := fmt.Sscanf(bp.Log(), "cpu-us-per-probe %d", &baseProbeUS); err != nil {
		b.Fatalf("baseline probe printed %q", bp.Log())
	}

	// A SIGKILLed prober: how long until every proxy it held is probed by
	// another. Its share is what rendezvous hashing gave it.
	killed := "prober-1"
	share := map[string]bool{}
	for i := range n {
		if id := fmt.Sprintf("%s/px-%05d", ns, i); assignment.Owner([]string{"prober-0", "prober-1", "prober-2"}, id) == killed {
			share[fmt.Sprintf("px-%05d", i)] = true
		}
	}
	metricsURL := "http://" + s.Controllers[0].Metrics + "/metrics"
	say("SIGKILL %s, which held %d proxies", killed, len(share))
	s.Probers[1].Kill()
	killedAt := time.Now()
	var reprobe []time.Duration
	for {
		m, err := promtext.Scrape(nil, metricsURL)
		if err != nil {
			b.Fatal(err)
		}
		reprobe = reprobe[:0]
		for k, v := range m {
			if g := lastProbeRe.FindStringSubmatch(k); g != nil && share[g[1]] {
				if at := time.UnixMilli(int64(v * 1000)); at.After(killedAt) {
					reprobe = append(reprobe, at.Sub(killedAt))
				}
			}
		}
		if len(reprobe) == len(share) {
			break
		}
		if time.Since(killedAt) > 3*interval+time.Minute {
			b.Fatalf("only %d of %d proxies of the killed prober were probed again after %s", len(reprobe), len(share), time.Since(killedAt).Round(time.Second))
		}
		time.Sleep(100 * time.Millisecond)
	}
	reprobeP50, _ := percentiles(reprobe) // sorts
	reprobeMax := reprobe[len(reprobe)-1]

	// REST at this fleet size, each beside the same answer served from
	// memory by a bare net/http server on loopback.
	broker := s.Brokers[0].REST
	httpc := &http.Client{}
	var listBody, leaseBody []byte
	// call returns one timed request: its answer must be 200, and keep,
	// when set, receives the body.
	call := func(method, url, body string, keep *[]byte) func() error {
		return func() error {
			req, err := http.NewRequest(method, url, strings.NewReader(body))
			if err != nil {
				return err
			}
			resp, err := httpc.Do(req)
			if err != nil {
				return err
			}
			got, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s %s: %s %s", method, url, resp.Status, got)
			}
			if keep != nil {
				*keep = got
			}
			return err
		}
	}
	// Every healthy proxy, page by page; then the figure: the first page
	// of 100, as a dashboard or a client cache reads it.
	healthy, token := 0, ""
	for first := true; first || token != ""; first = false {
		if err := call(http.MethodGet, broker+"/v1/proxies?healthy=true&pageToken="+token, "", &listBody)(); err != nil {
			b.Fatal(err)
		}
		var listed struct {
			Proxies       []json.RawMessage
			NextPageToken string
		}
		if err := json.Unmarshal(listBody, &listed); err != nil {
			b.Fatal(err)
		}
		healthy, token = healthy+len(listed.Proxies), listed.NextPageToken
	}
	if healthy != n {
		b.Fatalf("the broker listed %d healthy proxies, want %d", healthy, n)
	}
	listLat, err := timeCalls(100, call(http.MethodGet, broker+"/v1/proxies?healthy=true&pageSize=100", "", &listBody))
	if err != nil {
		b.Fatal(err)
	}
	leaseLat, err := timeCalls(500, call(http.MethodPost, broker+"/v1/leases", `{"ttlSeconds":60}`, &leaseBody))
	if err != nil {
		b.Fatal(err)
	}
	static := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPost {
			_, _ = io.Copy(io.Discard, r.Body)
			_, _ = w.Write(leaseBody)
			return
		}
		_, _ = w.Write(listBody)
	}))
	defer static.Close()
	baseListLat, err := timeCalls(100, call(http.MethodGet, static.URL+"/v1/proxies", "", nil))
	if err != nil {
		b.Fatal(err)
	}
	baseLeaseLat, err := timeCalls(500, call(http.MethodPost, static.URL+"/v1/leases", `{"ttlSeconds":60}`, nil))
	if err != nil {
		b.Fatal(err)
	}

	// The bring-up's baseline, once every service is stopped so that the
	// API server (still holding the fleet) does nothing else.
	s.Controllers[0].Proc.Kill()
	for _, p := range s.Probers {
		p.Kill()
	}
	for _, br := range s.Brokers {
		br.Proc.Kill()
	}
	say("baseline: the API server alone taking the bring-up's %d writes (32 writers, the services stopped)", 3*n)
	apiParts := []string{"(part) kube-apiserver", "(part) etcd"}
	parts := func() map[string]proc.Usage {
		m := map[string]proc.Usage{}
		for _, r := range rows {
			if slices.Contains(apiParts, r.name) {
				m[r.name], _ = proc.ProcUsage(r.pid)
			}
		}
		return m
	}
	floorUsage0, floorUsage1 := parts(), map[string]proc.Usage{}
	floor, err := apiFloor(ctx, env.Client, n, func() { floorUsage1 = parts() })
	if err != nil {
		b.Fatalf("API floor: %v", err)
	}

	// The report.
	fmt.Println()
	say("N=%d, interval %s, timeout %s, success threshold %d, on %d CPUs", n, interval, timeout, successThreshold, runtime.NumCPU())
	upW, steadyW := writes1.minus(writes0), writes2.minus(writes1)
	perProxy := func(v float64) string { return strconv.FormatFloat(v/float64(n), 'f', 2, 64) }
	_, _ = fmt.Fprintln(out, "\nfigure\tmeasured\tbaseline\tratio")
	_, _ = fmt.Fprintf(out, "apply (32 writers)\t%s\t\t\n", applied.Round(time.Millisecond))
	_, _ = fmt.Fprintf(out, "all Ready (the lifecycle's part), from the start of the apply\t%s\t\t\n", w.steps.lastAt(w.steps.ready, start).Round(time.Millisecond))
	_, _ = fmt.Fprintf(out, "all Ready and Healthy, from the start of the apply\t%s\tschedule bound %s\t%.2f (target: bound + %s)\n",
		bringUp.Round(time.Millisecond), bound, bringUp.Seconds()/bound.Seconds(), map[bool]time.Duration{true: 10 * time.Second, false: time.Minute}[n <= 1000])
	_, _ = fmt.Fprintf(out, "  the same, against the API server's own floor for its writes\t%s\tAPI floor %s\t%.2f\n",
		bringUp.Round(time.Millisecond), floor.Round(time.Millisecond), bringUp.Seconds()/floor.Seconds())
	w.steps.report(out, start, interval)
	// Where the bring-up's time went on this machine: every process here
	// shares its CPUs, and probing (the probers, the Squids) runs at its
	// configured rate through the whole bring-up.
	var busy, probing time.Duration
	for _, r := range rows {
		d := usage1[r.name].CPU - usage0[r.name].CPU
		busy += d
		if r.ops != "" || strings.HasPrefix(r.name, "(part) squid") {
			probing += d
		}
	}
	avail := time.Duration(runtime.NumCPU()) * bringUp
	_, _ = fmt.Fprintf(out, "CPU of the processes below in bring-up / the machine's (wall × %d CPUs); of it, probing (probers, Squids)\t%.1fs / %.1fs; %.1fs\t\t%.2f; %.2f\n",
		runtime.NumCPU(), busy.Seconds(), avail.Seconds(), probing.Seconds(), busy.Seconds()/avail.Seconds(), probing.Seconds()/busy.Seconds())
	// The same writes cost the API server more beside the services'
	// watches and reads than alone: the difference is theirs.
	for _, name := range apiParts {
		if _, ok := floorUsage1[name]; !ok {
			continue
		}
		up, alone := usage1[name].CPU-usage0[name].CPU, floorUsage1[name].CPU-floorUsage0[name].CPU
		_, _ = fmt.Fprintf(out, "  %s CPU for the bring-up's writes, with the services / alone (the floor)\t%.1fs\t%.1fs\t%.2f\n",
			strings.TrimPrefix(name, "(part) "), up.Seconds(), alone.Seconds(), up.Seconds()/max(alone.Seconds(), 0.001))
	}
	probed := 0.0
	for _, v := range probes0 {
		probed += v
	}
	mean := func(hist, labels string) string {
		sum, count := ctrlMetrics[hist+"_sum"+labels], ctrlMetrics[hist+"_count"+labels]
		if count == 0 {
			return "-"
		}
		return (time.Duration(sum / count * float64(time.Second))).Round(100 * time.Microsecond).String()
	}
	_, _ = fmt.Fprintf(out, "  in the controller, mean: lifecycle queue wait / reconcile; health write queue wait / write\t%s / %s; %s / %s\t\t\n",
		mean("workqueue_queue_duration_seconds", `{controller="proxy-lifecycle",name="proxy-lifecycle"}`),
		mean("controller_runtime_reconcile_time_seconds", `{controller="proxy-lifecycle"}`),
		mean("workqueue_queue_duration_seconds", `{controller="proxy_health_status",name="proxy_health_status"}`),
		mean("workqueue_work_duration_seconds", `{controller="proxy_health_status",name="proxy_health_status"}`))
	_, _ = fmt.Fprintf(out, "probes in bring-up (failed)\t%.0f (%.0f)\t\t\n", probed, failed0)
	_, _ = fmt.Fprintf(out, "API writes/proxy in bring-up, all (the apply's create included)\t%s\t3 (create, lifecycle status, first verdict)\t%.2f\n", perProxy(upW.All), upW.All/float64(n)/3)
	_, _ = fmt.Fprintf(out, "  Proxy creates / Proxy status and other writes / Event writes / refused as conflicts\t%s / %s / %s / %s\t\t\n",
		perProxy(upW.ProxyCreates), perProxy(upW.ProxyOther), perProxy(upW.Events), perProxy(upW.Conflicts))
	_, _ = fmt.Fprintf(out, "  Proxy LISTs in bring-up (a watch the API server dropped is re-listed)\t%.0f\t0\t\n", upW.ProxyLists)
	steadyPerHour := (steadyW.ProxyCreates + steadyW.ProxyOther) / float64(n) * time.Hour.Seconds() / window.Seconds()
	_, _ = fmt.Fprintf(out, "Proxy writes/proxy/hour, steady (%s window)\t%.2f\t0 (transitions only)\t\n", window, steadyPerHour)
	_, _ = fmt.Fprintf(out, "  all API writes in the window (leader election included)\t%.0f\t\t\n", steadyW.All)
	for _, r := range rows {
		u0, u1, u2 := usage0[r.name], usage1[r.name], usage2[r.name]
		line := fmt.Sprintf("%s: RSS %s (peak %s), CPU %.1fs bring-up, %.1fs steady", r.name, mib(u2.RSS), mib(u2.Peak),
			(u1.CPU - u0.CPU).Seconds(), (u2.CPU - u1.CPU).Seconds())
		switch {
		case strings.HasPrefix(r.name, "(part)"):
			_, _ = fmt.Fprintf(out, "%s\t\t\t\n", line)
		case r.ops != "":
			per := 0.0
			if probes[r.name] > 0 {
				per = float64((u2.CPU - u1.CPU).Microseconds()) / probes[r.name]
			}
			_, _ = fmt.Fprintf(out, "%s\tRSS/assigned %s for %.0f assigned\t\t\n", line, bytesPer(u2.RSS, assigned[r.name]), assigned[r.name])
			_, _ = fmt.Fprintf(out, "  %s CPU per probe\t%.0f µs (%.0f probes)\tminimal probe %d µs\t%.2f\n", r.name, per, probes[r.name],
				baseProbeUS, per/float64(max(1, baseProbeUS)))
		default:
			_, _ = fmt.Fprintf(out, "%s\tRSS\tbare informer %s\t%.2f\n", line, mib(informerUsage.RSS), float64(u2.RSS)/float64(informerUsage.RSS))
		}
	}
	_, _ = fmt.Fprintf(out, "baseline: a bare Proxy informer holding the same fleet: RSS %s, CPU %.1fs to list and watch it\t\t\t\n", mib(informerUsage.RSS), informerUsage.CPU.Seconds())
	_, _ = fmt.Fprintf(out, "killed prober's share (%d) probed again, p50 / max\t%s / %s\tinterval %s\t%.2f (max)\n", len(reprobe),
		reprobeP50.Round(time.Millisecond), reprobeMax.Round(time.Millisecond), interval, reprobeMax.Seconds()/interval.Seconds())
	lp50, lp99 := percentiles(listLat)
	bl50, bl99 := percentiles(baseListLat)
	_, _ = fmt.Fprintf(out, "REST list healthy, a page of 100 of %d proxies (%d KiB) p50 / p99\t%s / %s\tstatic %s / %s\t%.1f / %.1f\n", n, len(listBody)>>10,
		lp50.Round(time.Microsecond), lp99.Round(time.Microsecond), bl50.Round(time.Microsecond), bl99.Round(time.Microsecond),
		lp50.Seconds()/bl50.Seconds(), lp99.Seconds()/bl99.Seconds())
	ep50, ep99 := percentiles(leaseLat)
	be50, be99 := percentiles(baseLeaseLat)
	_, _ = fmt.Fprintf(out, "REST lease p50 / p99\t%s / %s\tstatic %s / %s\t%.1f / %.1f\n",
		ep50.Round(time.Microsecond), ep99.Round(time.Microsecond), be50.Round(time.Microsecond), be99.Round(time.Microsecond),
		ep50.Seconds()/be50.Seconds(), ep99.Seconds()/be99.Seconds())
	_ = out.Flush()
	fmt.Println()

	b.ReportMetric(bringUp.Seconds(), "bringup-s")
	b.ReportMetric(bringUp.Seconds()/bound.Seconds(), "bringup/bound")
	b.ReportMetric(upW.All/float64(n), "writes/proxy")
	b.ReportMetric(steadyPerHour, "steady-writes/proxy/h")
	b.ReportMetric(float64(usage2["controller"].RSS)/(1<<20), "controller-MiB")
	b.ReportMetric(reprobeMax.Seconds(), "reprobe-max-s")
}
