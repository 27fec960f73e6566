package lifecycle

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
)

var resyncsDeferred = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_resyncs_deferred_total",
	Help: "Resyncs of Ready instances that waited for their provider entry's resync budget (--resync-qps); steady growth means Ready proxies are re-read less often than --resync-interval.",
}, []string{"provider"})

// Collectors are the package's metrics; the controller registers them.
func Collectors() []prometheus.Collector { return []prometheus.Collector{resyncsDeferred} }

// resyncs spreads and bounds the periodic re-reads of Ready instances,
// which exist only to notice an instance removed behind the controller's
// back. Left alone they cost one provider call per proxy per interval, all
// at once for a fleet applied at once. Two things keep them cheap:
//   - jitter: each proxy's next re-read falls anywhere in ±25% of the
//     interval, so a fleet's re-reads drift apart within a few rounds;
//   - a budget: each provider entry allows at most qps re-reads a second,
//     however many proxies it serves. Past qps × interval Ready proxies on
//     one entry, each is re-read less often than the interval says, and
//     proxy_operator_resyncs_deferred_total says so.
//
// Creation, replacement, deletion and booting instances are never held
// back: only the re-read of an instance already known to run waits.
type resyncs struct {
	interval time.Duration
	qps      float64
	clock    clock.PassiveClock

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // by provider entry
	// granted: proxies holding a reservation, and when it is theirs. A
	// proxy told to wait keeps its place instead of asking again.
	granted map[string]time.Time
}

func newResyncs(interval time.Duration, qps float64, clk clock.PassiveClock) *resyncs {
	return &resyncs{interval: interval, qps: qps, clock: clk, limiters: map[string]*rate.Limiter{}, granted: map[string]time.Time{}}
}

// next is when a Ready proxy is re-read again.
func (r *resyncs) next() time.Duration {
	return time.Duration(float64(r.interval) * (0.75 + 0.5*rand.Float64()))
}

// wait returns 0 when the proxy at key may re-read its instance from
// provider now, else how long it must wait; its turn is reserved.
func (r *resyncs) wait(key, provider string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.granted[key]; ok {
		if d := at.Sub(r.clock.Now()); d > 0 {
			return d
		}
		delete(r.granted, key)
		return 0
	}
	lim, ok := r.limiters[provider]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(r.qps), max(1, int(r.qps)))
		r.limiters[provider] = lim
	}
	now := r.clock.Now()
	d := lim.ReserveN(now, 1).DelayFrom(now)
	if d <= 0 {
		return 0
	}
	r.granted[key] = now.Add(d)
	resyncsDeferred.WithLabelValues(provider).Inc()
	return d
}

// forget drops a proxy's reservation (it is gone, or no longer Ready).
func (r *resyncs) forget(key string) {
	r.mu.Lock()
	delete(r.granted, key)
	r.mu.Unlock()
}
