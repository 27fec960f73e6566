package health

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
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
		Name: "proxy_operator_healthcheck_last_timestamp_seconds", Help: "When each proxy was last probed (true probe recency; status.lastHealthCheckTime moves on transitions only).",
	}, []string{"namespace", "name"})
)

func init() { ctrlmetrics.Registry.MustRegister(checks, checkDuration, lastCheck) }

// Engine applies thresholds to results and writes health transitions.
type Engine struct {
	Client client.Client
	Log    *slog.Logger

	mu    sync.Mutex
	state map[types.UID]*counter
}

// counter is the running state of one proxy instance.
type counter struct {
	addr          string // results for another address are stale
	succ, fail    int
	healthy       *bool // last written health; nil = Unknown
	egressIP      string
	failureThresh int
	successThresh int
}

// track (re)arms the counter for a target; a new address (a replacement)
// starts from Unknown.
func (e *Engine) track(uid types.UID, addr string, r resolved, healthy *bool, egress string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state == nil {
		e.state = map[types.UID]*counter{}
	}
	c, ok := e.state[uid]
	if !ok || c.addr != addr {
		c = &counter{addr: addr, healthy: healthy, egressIP: egress}
		e.state[uid] = c
	}
	c.failureThresh, c.successThresh = r.FailureThreshold, r.SuccessThreshold
}

func (e *Engine) forget(uid types.UID) {
	e.mu.Lock()
	delete(e.state, uid)
	e.mu.Unlock()
}

var tracer = otel.Tracer("egress-proxies/controller/health")

// Handle takes one result and writes status when the health (or the
// echoed egress IP) changes; most results write nothing.
func (e *Engine) Handle(ctx context.Context, proberID string, r *probev1.ProbeResult) {
	result := "success"
	if !r.GetSuccess() {
		result = "failure"
	}
	checks.WithLabelValues(result).Inc()
	checkDuration.Observe(r.GetLatency().AsDuration().Seconds())
	ns, name, _ := strings.Cut(r.GetId(), "/")
	lastCheck.WithLabelValues(ns, name).Set(float64(r.GetFinishedAt().AsTime().Unix()))

	e.mu.Lock()
	c, ok := e.state[types.UID(r.GetUid())]
	if !ok {
		e.mu.Unlock()
		return // not (or no longer) a target: a stale result
	}
	var want *bool
	if r.GetSuccess() {
		c.succ, c.fail = c.succ+1, 0
		if c.succ >= c.successThresh && (c.healthy == nil || !*c.healthy) {
			t := true
			want = &t
		}
	} else {
		c.fail, c.succ = c.fail+1, 0
		if c.fail >= c.failureThresh && (c.healthy == nil || *c.healthy) {
			f := false
			want = &f
		}
	}
	egressChanged := r.GetSuccess() && r.GetEgressIp() != "" && r.GetEgressIp() != c.egressIP
	addr := c.addr
	e.mu.Unlock()
	if want == nil && !egressChanged {
		return
	}

	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("proxy", r.GetId()), attribute.String("prober", proberID), attribute.Bool("probe.success", r.GetSuccess()))}
	if tp := r.GetTraceparent(); tp != "" {
		remote := otel.GetTextMapPropagator().Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: trace.SpanContextFromContext(remote)}))
	}
	ctx, span := tracer.Start(ctx, "health.Transition", opts...)
	defer span.End()
	written, err := e.write(ctx, types.NamespacedName{Namespace: ns, Name: name}, types.UID(r.GetUid()), addr, want, r)
	if err != nil {
		span.RecordError(err)
		e.Log.ErrorContext(ctx, "writing health", "proxy", r.GetId(), "err", err)
		return
	}
	if !written {
		return
	}
	e.mu.Lock()
	if c, ok := e.state[types.UID(r.GetUid())]; ok && c.addr == addr {
		if want != nil {
			c.healthy = want
		}
		if egressChanged {
			c.egressIP = r.GetEgressIp()
		}
	}
	e.mu.Unlock()
}

// write patches the Healthy condition (and egressIP) of the Proxy, if it
// is still the instance the result is about.
func (e *Engine) write(ctx context.Context, key types.NamespacedName, uid types.UID, addr string, healthy *bool, r *probev1.ProbeResult) (bool, error) {
	for attempt := 0; attempt < 5; attempt++ {
		px := &v1.Proxy{}
		if err := e.Client.Get(ctx, key, px); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		if px.UID != uid || fmt.Sprintf("%s:%d", px.Status.IP, px.Status.Port) != addr {
			return false, nil // replaced or gone since the probe ran
		}
		base := px.DeepCopy()
		now := metav1.NewTime(r.GetFinishedAt().AsTime().Truncate(time.Second))
		if healthy != nil {
			cond := metav1.Condition{Type: v1.ConditionHealthy, ObservedGeneration: px.Generation}
			if *healthy {
				cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, v1.ReasonProbeSucceeded, fmt.Sprintf("probes through the proxy pass (%s)", r.GetLatency().AsDuration().Round(time.Millisecond))
			} else {
				cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, v1.ReasonProbeFailed, fmt.Sprintf("%s: %s", phase(r.GetPhase()), r.GetReason())
			}
			meta.SetStatusCondition(&px.Status.Conditions, cond)
			px.Status.Healthy = *healthy
			px.Status.LastHealthCheckTime = &now
		}
		if r.GetSuccess() && r.GetEgressIp() != "" {
			px.Status.EgressIP = r.GetEgressIp()
		}
		err := e.Client.Status().Patch(ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return false, client.IgnoreNotFound(err)
		}
		metrics.StatusWrites.WithLabelValues("health").Inc()
		return true, nil
	}
	return false, fmt.Errorf("status of %s kept conflicting", key)
}

func phase(p probev1.ProbePhase) string {
	if s, ok := probev1.ProbePhase_name[int32(p)]; ok && p != 0 {
		return strings.ToLower(strings.TrimPrefix(s, "PROBE_PHASE_")) + " failed"
	}
	return "failed"
}
