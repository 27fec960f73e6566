package fleet

import (
	"context"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
)

// writes counts the API server's own tally of mutating requests.
type writes struct {
	ProxyCreates, ProxyOther, Events, All float64
	// Conflicts are writes refused for a stale resourceVersion (409).
	Conflicts float64
	// ProxyLists counts LISTs of Proxies: an informer lists once at
	// start, and again only when the API server dropped its watch.
	ProxyLists float64
}

var requestRe = regexp.MustCompile(`^apiserver_request_total\{(.*)\}$`)
var labelRe = regexp.MustCompile(`(\w+)="([^"]*)"`)

func apiWrites(c *http.Client, host string) (writes, error) {
	m, err := promtext.Scrape(c, strings.TrimSuffix(host, "/")+"/metrics")
	if err != nil {
		return writes{}, err
	}
	var w writes
	for k, v := range m {
		g := requestRe.FindStringSubmatch(k)
		if g == nil {
			continue
		}
		l := map[string]string{}
		for _, kv := range labelRe.FindAllStringSubmatch(g[1], -1) {
			l[kv[1]] = kv[2]
		}
		if l["verb"] == "LIST" && l["resource"] == "proxies" {
			w.ProxyLists += v
		}
		switch l["verb"] {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
		default:
			continue
		}
		w.All += v
		if l["code"] == "409" {
			w.Conflicts += v
		}
		switch {
		case l["resource"] == "proxies" && l["verb"] == "POST" && l["subresource"] == "":
			w.ProxyCreates += v
		case l["resource"] == "proxies":
			w.ProxyOther += v
		case l["resource"] == "events":
			w.Events += v
		}
	}
	return w, nil
}

func (w writes) minus(o writes) writes {
	return writes{w.ProxyCreates - o.ProxyCreates, w.ProxyOther - o.ProxyOther, w.Events - o.Events, w.All - o.All, w.Conflicts - o.Conflicts, w.ProxyLists - o.ProxyLists}
}

// percentiles returns p50 and p99 of ds (which it sorts).
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	if len(ds) == 0 {
		return 0, 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2], ds[min(len(ds)-1, len(ds)*99/100)]
}

// timeCalls runs call n times in a row and returns the latencies.
func timeCalls(n int, call func() error) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		if err := call(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(t))
	}
	return out, nil
}

// apiFloor is the bring-up's baseline: the API server taking the same
// writes the fleet's bring-up needs (a create, the lifecycle's status, the
// first verdict, per proxy) from 32 writers, with nothing else running and
// nothing to wait for between them. No controller can bring a fleet up
// faster than its API server takes these writes. written runs when the
// writes are done; the proxies are deleted after it, before it returns.
func apiFloor(ctx context.Context, c client.Client, n int, written func()) (time.Duration, error) {
	const floorNS = "api-floor"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: floorNS}}); err != nil {
		return 0, err
	}
	start := time.Now()
	err := parallel(32, n, func(i int) error {
		px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("px-%05d", i), Namespace: floorNS},
			Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: "127.0.9.1", Port: 3128, Attributes: map[string]string{"geo": "local"}}}
		if err := c.Create(ctx, px); err != nil {
			return err
		}
		for _, step := range []func(*v1.Proxy){
			func(px *v1.Proxy) {
				px.Status.Phase, px.Status.IP, px.Status.Port, px.Status.InstanceGeneration = v1.PhaseReady, px.Spec.Address, px.Spec.Port, 1
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonTracking, Message: "tracking external proxy at 127.0.9.1:3128"})
			},
			func(px *v1.Proxy) {
				px.Status.Healthy, px.Status.EgressIP, px.Status.HealthInstanceGeneration = true, "127.0.0.1", 1
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded, Message: "probes through the proxy pass (3ms)"})
			},
		} {
			base := px.DeepCopy()
			step(px)
			if err := c.Status().Patch(ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
				return err
			}
		}
		return nil
	})
	took := time.Since(start)
	if err != nil {
		return 0, err
	}
	written()
	if err := c.DeleteAllOf(ctx, &v1.Proxy{}, client.InNamespace(floorNS)); err != nil {
		return 0, err
	}
	return took, nil
}

// parallel runs f(0..n-1) on workers goroutines and returns the first error.
func parallel(workers, n int, f func(i int) error) error {
	next := make(chan int)
	var wg sync.WaitGroup
	var first error
	var once sync.Once
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return first
}
