package fleet

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
)

var env *testenv.Env

// TestMain starts the API server only for a benchmark run: `make test`
// compiles this package and runs nothing in it.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		os.Exit(m.Run())
	}
	os.Exit(testenv.Main(m, &env))
}

const ns = "fleet"

// settings are the run's size: FLEET_N proxies (default 1,000) probed every
// FLEET_INTERVAL (default: the demo's 2 s up to 1,000 proxies, the
// controller's default 30 s above), each probe bounded by FLEET_TIMEOUT
// (1.5 s, or the default 10 s with the 30 s interval; it must be below
// the interval).
// FLEET_CONTROLLER_ARGS adds controller flags, to try other settings.
func settings(b *testing.B) (n int, interval, timeout time.Duration) {
	n = 1000
	if v := os.Getenv("FLEET_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("FLEET_N=%q: want a positive number", v)
		}
	}
	interval, timeout = 2*time.Second, 1500*time.Millisecond
	if n > 1000 {
		interval, timeout = 30*time.Second, 10*time.Second
	}
	for _, kv := range []struct {
		name string
		d    *time.Duration
	}{{"FLEET_INTERVAL", &interval}, {"FLEET_TIMEOUT", &timeout}} {
		if v := os.Getenv(kv.name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				b.Fatalf("%s=%q: want a positive duration such as 30s", kv.name, v)
			}
			*kv.d = d
		}
	}
	return n, interval, timeout
}

// watcher follows the fleet through an informer, as a user watching
// `kubectl get px -w` would, and notes when all of it is Ready and Healthy.
type watcher struct {
	n       int
	mu      sync.Mutex
	good    map[string]bool
	goodN   int
	steps   *steps
	allGood chan struct{}
	once    sync.Once
}

func (w *watcher) see(o any) {
	px, ok := o.(*v1.Proxy)
	if !ok || px.Namespace != ns {
		return
	}
	good := px.Status.Phase == v1.PhaseReady && px.Status.Healthy &&
		meta.IsStatusConditionTrue(px.Status.Conditions, v1.ConditionHealthy)
	w.mu.Lock()
	if was := w.good[px.Name]; was != good {
		w.goodN += map[bool]int{true: 1, false: -1}[good]
	}
	w.good[px.Name] = good
	count := w.goodN
	w.mu.Unlock()
	now := time.Now()
	if px.Status.Phase == v1.PhaseReady {
		w.steps.mark(w.steps.ready, px.Name, now)
	}
	if good {
		w.steps.mark(w.steps.healthy, px.Name, now)
	}
	if count == w.n {
		w.once.Do(func() { close(w.allGood) })
	}
}

func (w *watcher) count() (good, seen int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.goodN, len(w.good)
}

type procRow struct {
	name string
	pid  int
	ops  string // metrics endpoint, for probers
}

func mib(n int64) string { return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20)) }

func bytesPer(rss int64, n float64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f KiB", float64(rss)/n/1024)
}

// proberProbes reads a prober's probe counters: all, and failed.
func proberProbes(b *testing.B, ops string) (all, failed float64) {
	m, err := promtext.Scrape(nil, "http://"+ops+"/metrics")
	if err != nil {
		b.Fatal(err)
	}
	for k, v := range m {
		if strings.HasPrefix(k, "proxy_operator_prober_probes_total{") {
			all += v
			if strings.Contains(k, `result="failure"`) {
				failed += v
			}
		}
	}
	return all, failed
}

// childNamed finds a child of this process by its command name (envtest
// runs kube-apiserver and etcd as children); 0 if none.
func childNamed(name string) int {
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		stat, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if strings.TrimSpace(string(comm)) != name || len(stat) == 0 {
			continue
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if ppid, _ := strconv.Atoi(f[1]); ppid == os.Getpid() {
			return pid
		}
	}
	return 0
}
