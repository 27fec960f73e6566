package health

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/probespec"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
)

var (
	checks = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_healthcheck_total",
		Help: "Probe results received, by result (success, failure). Counts every probe, not only status-affecting ones.",
	}, []string{"result"})
	checkDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "proxy_operator_healthcheck_duration_seconds", Help: "Latency of probes through proxies, as measured by the probers.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	})
	lastCheck = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_healthcheck_last_timestamp_seconds", Help: "When each proxy was last probed, in seconds with millisecond resolution (true probe recency; status.lastHealthCheckTime moves on transitions only).",
	}, []string{"namespace", "name"})
	staleProxies = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "proxy_operator_proxies_probe_stale", Help: "Proxies whose health is stale (Healthy=Unknown, reason ProbeStale): no probe result for --health-stale-intervals of their interval. Above zero, probing has stopped for them.",
	})
)

// Collectors are the package's metrics, the probe endpoint's included;
// the controller registers them.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{checks, checkDuration, lastCheck, staleProxies, probersConnected, assignments, reassigned, rejected, grpcMetrics}
}

// DefaultStaleIntervals is how many of its intervals a proxy may go
// without a result before its health is stale: one lost or late probe is
// weather, three in a row is probing that has stopped.
const DefaultStaleIntervals = 3

// sweepEvery is how often the leader looks for proxies gone stale.
const sweepEvery = 500 * time.Millisecond

// DefaultWriteWorkers is how many health status writes run at once by
// default, as many as the lifecycle's reconcilers: a fleet's first
// verdicts (or a fleet-wide flip) come out as fast as the API server's
// latency allows, still well within the client's QPS. Sixteen made the
// verdict's write the longest step of a 10,000-proxy bring-up (decision
// 120).
const DefaultWriteWorkers = 32

// Engine turns probe results into health verdicts and writes the verdicts
// to Proxy status. The two halves are apart on purpose: Handle runs in the
// probe stream's receive loop and only counts, in memory; a verdict that
// changes puts the proxy on a queue that coalesces per proxy, and workers
// of their own write it. A fleet-wide flip (the health target's site goes
// down: every proxy fails at once) therefore never stalls result intake,
// and a proxy that flips twice before its write is written once, with the
// newer verdict, or not at all.
//
// Results are also the only proof that probing still runs, so the engine
// keeps, per proxy, when it last had one: a proxy with none for
// StaleIntervals of its interval becomes Healthy=Unknown (ProbeStale) and
// so stops being leasable, and its next result decides it again. Without
// this a stopped probe fleet would leave every proxy Healthy for good,
// because writes happen on transitions only.
type Engine struct {
	// client reads Proxies (the manager's cache) and patches their status.
	client   client.Client
	recorder events.EventRecorder
	// elected is closed once this replica leads. Only the leader writes,
	// and staleness counts from its election: a new leader has had no
	// result from anyone yet. nil means leading from the start.
	elected <-chan struct{}
	log     *slog.Logger
	opts    EngineOptions

	mu    sync.Mutex
	state map[types.UID]*counter
	// spent counts probe bytes and probes per proxy id, for metered
	// sources (ProbeBytes).
	spent map[types.NamespacedName]*probeSpend
	queue workqueue.TypedRateLimitingInterface[types.UID]
}

// counter is the running state of one proxy instance.
type counter struct {
	key  types.NamespacedName
	addr string // results for another address are stale
	// gen is the instance generation the counter is about: health
	// written for another one describes an instance that is gone.
	gen           int64
	succ, fail    int
	failureThresh int
	successThresh int
	interval      time.Duration
	// last is when the controller last had a result for the proxy, on its
	// own clock (a prober's clock may be off), or when it started waiting
	// for one (tracking began, this replica was elected).
	last time.Time
	// verdict is what the thresholds decided; nil while they have not
	// (NotProbed). The writer makes status say it.
	verdict *verdict
	// egressIP is the address the target last echoed; "" if none.
	egressIP string
	// queued counts the times the proxy was put on the write queue;
	// written is the count a writer had seen when status last said what
	// the engine wants. They differ while a write is owed.
	queued, written uint64
	// confirmAfter is when the brokers quarantined the proxy: its next
	// success in a later second is written (confirmed), so the brokers,
	// which see probes only through status, end the quarantine.
	confirmAfter time.Time
	confirmed    metav1.Time
}

// probeSpend is what probes through one proxy have cost.
type probeSpend struct{ bytes, probes int64 }

// ProbeBytes sums the bytes probes spent through the proxies ids, and
// counts the probes, since the process started: a metered ProxySource's
// meter.
func (e *Engine) ProbeBytes(ids []types.NamespacedName) (bytes, probes int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, id := range ids {
		if s := e.spent[id]; s != nil {
			bytes, probes = bytes+s.bytes, probes+s.probes
		}
	}
	return bytes, probes
}

// verdict is one health decision and the result that made it.
type verdict struct {
	status      metav1.ConditionStatus
	reason, msg string
	at          metav1.Time
	// traceparent of the deciding probe, to link the write's span to it.
	traceparent string
}

func (v *verdict) healthy() bool { return v != nil && v.status == metav1.ConditionTrue }
func (v *verdict) stale() bool   { return v != nil && v.reason == v1.ReasonProbeStale }

// fromCondition is the verdict status already says: nil for none yet.
func fromCondition(c *metav1.Condition) *verdict {
	if c == nil || (c.Status == metav1.ConditionUnknown && c.Reason != v1.ReasonProbeStale) {
		return nil
	}
	return &verdict{status: c.Status, reason: c.Reason, msg: c.Message, at: c.LastTransitionTime}
}

// setVerdict changes c's verdict and keeps the stale gauge true; mu held.
func setVerdict(c *counter, v *verdict) {
	if c.verdict.stale() {
		staleProxies.Dec()
	}
	if v.stale() {
		staleProxies.Inc()
	}
	c.verdict = v
}

// EngineOptions tune the engine; zero values take the defaults.
type EngineOptions struct {
	// Workers is how many status writes run at once; 0 means
	// DefaultWriteWorkers.
	Workers int
	// StaleIntervals: intervals without a result before health is stale;
	// 0 means DefaultStaleIntervals.
	StaleIntervals int
	// Clock is the engine's time, its sweep's ticker included; nil is the
	// wall clock. Tests step a fake one.
	Clock clock.WithTicker
}

// NewEngine returns an engine that reads and writes Proxies through c,
// records health transitions as Events on recorder (nil: none), and
// writes once elected is closed (nil: at once).
func NewEngine(c client.Client, recorder events.EventRecorder, elected <-chan struct{}, log *slog.Logger, o EngineOptions) *Engine {
	if o.Workers <= 0 {
		o.Workers = DefaultWriteWorkers
	}
	if o.StaleIntervals <= 0 {
		o.StaleIntervals = DefaultStaleIntervals
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Engine{
		client: c, recorder: recorder, elected: elected, log: log, opts: o,
		state: map[types.UID]*counter{}, spent: map[types.NamespacedName]*probeSpend{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](10*time.Millisecond, 30*time.Second),
			// Named, so controller-runtime's workqueue_* metrics show its
			// depth and latency (name="proxy_health_status").
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "proxy_health_status"}),
	}
}

// Track (re)arms the counter for a target at addr. A new instance (a
// replacement, an External proxy moved) starts afresh: status says what
// is known of it, or, when status is about an earlier instance, nothing,
// and the engine owes the write that resets it.
func (e *Engine) Track(px *v1.Proxy, addr string, r Settings) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, fresh := e.counterFor(px, addr)
	switch {
	case fresh:
		if st := &px.Status; st.HealthIsCurrent() {
			// Health of this instance; when written before the engine
			// stamped instances (see HealthIsCurrent), the write owed
			// below stamps it.
			c.egressIP = st.EgressIP
			setVerdict(c, fromCondition(meta.FindStatusCondition(st.Conditions, v1.ConditionHealthy)))
		}
		if owesStamp(px) {
			e.owe(px.UID, c)
		}
	case c.verdict != nil && c.verdict.reason == v1.ReasonProbeDenied:
		// No longer denied (the deny list or the URL changed): probed
		// from scratch, and status must stop saying it is refused.
		setVerdict(c, &verdict{status: metav1.ConditionUnknown, reason: v1.ReasonNotProbed, msg: "no longer in --probe-deny-cidrs; not probed yet", at: metav1.Now()})
		c.last = e.opts.Clock.Now()
		e.owe(px.UID, c)
	}
	c.failureThresh, c.successThresh, c.interval = r.FailureThreshold, r.SuccessThreshold, r.Interval
}

// counterFor returns px's counter, a fresh one when there is none or it
// is about another instance or address (whatever was known of those does
// not carry over); mu held.
func (e *Engine) counterFor(px *v1.Proxy, addr string) (*counter, bool) {
	old, ok := e.state[px.UID]
	if ok && old.addr == addr && old.gen == px.Status.InstanceGeneration {
		return old, false
	}
	if ok {
		setVerdict(old, nil)
	}
	c := &counter{key: types.NamespacedName{Namespace: px.Namespace, Name: px.Name}, addr: addr, gen: px.Status.InstanceGeneration, last: e.opts.Clock.Now()}
	e.state[px.UID] = c
	return c, true
}

// owesStamp reports whether px's health fields say something without
// being stamped with its current instance: a write is owed, which resets
// them (about an earlier instance) or stamps them (written before the
// stamp existed, HealthIsCurrent).
func owesStamp(px *v1.Proxy) bool {
	st := &px.Status
	return st.HealthInstanceGeneration != st.InstanceGeneration &&
		(st.Healthy || st.EgressIP != "" || st.LastHealthCheckTime != nil || meta.FindStatusCondition(st.Conditions, v1.ConditionHealthy) != nil)
}

// Reset makes the engine write that px, not probe-able now (its instance
// is on its way, or it has none), is not known to be healthy, when its
// health is about an earlier instance; otherwise the engine forgets it.
func (e *Engine) Reset(px *v1.Proxy) {
	if !owesStamp(px) || px.Status.HealthIsCurrent() {
		e.Forget(px.UID) // stamped when it is probe-able again
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c, _ := e.counterFor(px, "")
	c.interval = 0
	e.owe(px.UID, c)
}

// Refuse records that the proxy is never probed, and why (its address or
// its health-check URL is in the probe deny list): Healthy=False with
// reason ProbeDenied, so it is never leased, and never stale.
func (e *Engine) Refuse(px *v1.Proxy, addr, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, _ := e.counterFor(px, addr)
	c.interval = 0
	if v := c.verdict; v != nil && v.reason == v1.ReasonProbeDenied && v.msg == why {
		return
	}
	setVerdict(c, &verdict{status: metav1.ConditionFalse, reason: v1.ReasonProbeDenied, msg: why, at: metav1.Now()})
	e.owe(px.UID, c)
}

// Forget drops a target, and its probe-recency series with it: a fleet
// that churns must not leave a series behind for every proxy it ever had.
func (e *Engine) Forget(uid types.UID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.state[uid]; ok {
		lastCheck.DeleteLabelValues(c.key.Namespace, c.key.Name)
		delete(e.spent, c.key)
		setVerdict(c, nil)
		delete(e.state, uid)
	}
}

// Handle takes one result. It never calls the API server: when the result
// changes the verdict (or the echoed egress IP), the proxy goes on the
// write queue; most results change nothing.
func (e *Engine) Handle(_ context.Context, proberID string, r *probev1.ProbeResult) {
	result := "success"
	if !r.GetSuccess() {
		result = "failure"
	}
	checks.WithLabelValues(result).Inc()
	checkDuration.Observe(r.GetLatency().AsDuration().Seconds())
	uid := types.UID(r.GetUid())
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.state[uid]
	if !ok {
		return // not (or no longer) a target: a stale result
	}
	lastCheck.WithLabelValues(c.key.Namespace, c.key.Name).Set(float64(r.GetFinishedAt().AsTime().UnixMilli()) / 1000)
	if n := r.GetBytes(); n > 0 {
		s := e.spent[c.key]
		if s == nil {
			s = &probeSpend{}
			e.spent[c.key] = s
		}
		s.bytes, s.probes = s.bytes+n, s.probes+1
	}
	c.last = e.opts.Clock.Now()
	// A stale proxy's first result decides it at once: the thresholds
	// guard a known verdict against one odd probe, and there is none.
	wasStale := c.verdict.stale()
	changed := false
	at := metav1.NewTime(r.GetFinishedAt().AsTime().Truncate(time.Second))
	if r.GetSuccess() {
		c.succ, c.fail = c.succ+1, 0
		if (wasStale || c.succ >= c.successThresh) && !c.verdict.healthy() {
			setVerdict(c, &verdict{status: metav1.ConditionTrue, reason: v1.ReasonProbeSucceeded, at: at, traceparent: r.GetTraceparent(),
				msg: fmt.Sprintf("probes through the proxy pass (%s)", r.GetLatency().AsDuration().Round(time.Millisecond))})
			changed = true
		}
		// A quarantined proxy's success is worth a write: it is the only
		// way the brokers learn of it. Status times have whole seconds, so
		// only a success in a later second than the quarantine began
		// provably follows it.
		if !c.confirmAfter.IsZero() && at.UnixMilli() > c.confirmAfter.UnixMilli() && c.verdict.healthy() {
			c.confirmed, c.confirmAfter = at, time.Time{}
			changed = true
		}
		// A new egress IP is worth a write of its own only for a proxy
		// already Healthy; before that it rides along with the verdict.
		if ip := r.GetEgressIp(); ip != "" && ip != c.egressIP {
			c.egressIP = ip
			changed = changed || c.verdict.healthy()
		}
	} else {
		c.fail, c.succ = c.fail+1, 0
		if (wasStale || c.fail >= c.failureThresh) && (c.verdict == nil || c.verdict.status != metav1.ConditionFalse) {
			setVerdict(c, &verdict{status: metav1.ConditionFalse, reason: v1.ReasonProbeFailed, at: at, traceparent: r.GetTraceparent(),
				msg: fmt.Sprintf("%s: %s", failedIn(r.GetPhase()), sanitize.Text(r.GetReason(), sanitize.MaxReason))})
			changed = true
		}
	}
	if changed {
		e.owe(uid, c)
	}
}

// Confirm tells the engine which proxies the brokers quarantined and
// since when, by "namespace/name" (the whole set each time): each one's
// next success is written to status.lastHealthCheckTime. The lease-view
// poller calls it on every answer.
func (e *Engine) Confirm(quarantined map[string]time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.state {
		since := quarantined[c.key.String()]
		if !since.IsZero() && c.confirmed.UnixMilli() > since.UnixMilli() {
			since = time.Time{} // confirmed already; the brokers catch up
		}
		c.confirmAfter = since
	}
}

// owe puts uid on the write queue: status no longer says what c does;
// mu held.
func (e *Engine) owe(uid types.UID, c *counter) {
	c.queued++
	e.queue.Add(uid)
}

// wanted is a copy of what status should say for uid, taken under the lock
// so a worker writes one consistent decision.
type wanted struct {
	key       types.NamespacedName
	addr      string
	gen       int64
	verdict   verdict
	decided   bool
	egressIP  string
	confirmed metav1.Time
	queued    uint64
}

func (e *Engine) wanted(uid types.UID) (wanted, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.state[uid]
	if !ok {
		return wanted{}, false
	}
	w := wanted{key: c.key, addr: c.addr, gen: c.gen, egressIP: c.egressIP, confirmed: c.confirmed, queued: c.queued}
	if c.verdict != nil {
		w.verdict, w.decided = *c.verdict, true
	}
	return w, true
}

// caughtUp records that status says what the engine wanted when it had
// queued the proxy q times.
func (e *Engine) caughtUp(uid types.UID, q uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c, ok := e.state[uid]; ok && c.written < q {
		c.written = q
	}
}

// Idle reports whether no write is owed: every verdict and egress IP the
// engine decided is in status, or about a proxy that is gone. Writes
// waiting out a retry backoff are owed.
func (e *Engine) Idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.state {
		if c.written != c.queued {
			return false
		}
	}
	return true
}

// restart starts every proxy's wait for a result afresh: a replica just
// elected has heard from no prober, and must give them the same time to
// find it that any proxy gets.
func (e *Engine) restart(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.state {
		c.last = now
	}
}

// sweep makes stale every proxy without a result for staleIntervals of
// its interval. It is one transition: a stale proxy stays stale,
// unwritten, until a result.
func (e *Engine) sweep(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := e.opts.StaleIntervals
	for uid, c := range e.state {
		if c.interval <= 0 || c.verdict.stale() || now.Sub(c.last) < time.Duration(n)*c.interval {
			continue
		}
		setVerdict(c, &verdict{status: metav1.ConditionUnknown, reason: v1.ReasonProbeStale, at: metav1.NewTime(now.Truncate(time.Second)),
			msg: fmt.Sprintf("no probe result for %s (%d intervals of %s): probing has stopped for this proxy; check that probers run and reach the leading controller",
				now.Sub(c.last).Round(time.Second), n, c.interval)})
		c.succ, c.fail = 0, 0
		e.owe(uid, c)
	}
}

// failedIn names where a probe failed, for the condition's message.
func failedIn(p probev1.ProbePhase) string {
	if name := probespec.PhaseName(p); name != "none" {
		return strings.ToLower(name) + " failed"
	}
	return "failed"
}
