package health

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/statuspatch"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
)

var tracer = otel.Tracer("egress-proxies/controller/health")

// errStale: the status the write was decided on changed under it.
var errStale = errors.New("status changed since it was read")

// Run writes verdicts, and watches for proxies gone stale, until ctx ends,
// once this replica leads. Writing is level-based: a worker compares the
// verdict with the Proxy as the cache has it and writes only the
// difference, under an optimistic lock, so a write decided on a stale read
// never lands (it is retried with backoff on a fresh one) and a verdict
// status already says is never written again.
func (e *Engine) Run(ctx context.Context) {
	if e.elected != nil {
		select {
		case <-ctx.Done():
			e.queue.ShutDown()
			return
		case <-e.elected:
		}
	}
	e.restart(e.opts.Clock.Now())
	var wg sync.WaitGroup
	defer wg.Wait()
	for range e.opts.Workers {
		wg.Go(func() {
			for e.next(ctx) {
			}
		})
	}
	tick := e.opts.Clock.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			e.queue.ShutDown()
			return
		case now := <-tick.C():
			e.sweep(now)
		}
	}
}

func (e *Engine) next(ctx context.Context) bool {
	uid, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(uid)
	switch q, err := e.write(ctx, uid); {
	case err == nil:
		e.caughtUp(uid, q)
		e.queue.Forget(uid)
	case errors.Is(err, errStale):
		e.queue.AddRateLimited(uid)
	default:
		e.log.ErrorContext(ctx, "writing health; will retry", "uid", uid, "err", err)
		e.queue.AddRateLimited(uid)
	}
	return true
}

// write makes the Proxy's status say what the engine decided for uid, if
// it is still the instance the verdict is about. It returns how often the
// proxy had been queued when the decision it wrote (or found written) was
// read.
func (e *Engine) write(ctx context.Context, uid types.UID) (uint64, error) {
	w, ok := e.wanted(uid)
	if !ok {
		return 0, nil // no longer a target
	}
	px := &v1.Proxy{}
	if err := e.client.Get(ctx, w.key, px); err != nil {
		return w.queued, client.IgnoreNotFound(err)
	}
	if px.UID != uid || px.Status.InstanceGeneration != w.gen || (w.addr != "" && fmt.Sprintf("%s:%d", px.Status.IP, px.Status.Port) != w.addr) {
		return w.queued, nil // replaced or gone since the probe ran; the informer re-arms the counter
	}
	base := px.DeepCopy()
	if st := &px.Status; st.HealthInstanceGeneration != w.gen {
		if !st.HealthIsCurrent() {
			// About an earlier instance: nothing of it carries over.
			st.Healthy, st.EgressIP, st.LastHealthCheckTime = false, "", nil
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{
				Type: v1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: v1.ReasonNotProbed,
				Message: fmt.Sprintf("instance %d not probed yet", w.gen), ObservedGeneration: px.Generation,
			})
		}
		st.HealthInstanceGeneration = w.gen
	}
	cur := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy)
	var was string // the reason status had, for the Event
	transition := false
	if v := w.verdict; w.decided {
		// A reason of the same status is a transition too (NotProbed to
		// ProbeStale); the message alone is not (a stale proxy's count
		// of seconds).
		if cur == nil || cur.Status != v.status || cur.Reason != v.reason || px.Status.Healthy != v.healthy() {
			if cur != nil {
				was = cur.Reason
			}
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{
				Type: v1.ConditionHealthy, Status: v.status, Reason: v.reason, Message: v.msg, ObservedGeneration: px.Generation,
			})
			px.Status.Healthy = v.healthy()
			if v.status != metav1.ConditionUnknown { // no probe decided it; the last one stays the last
				at := v.at
				px.Status.LastHealthCheckTime = &at
			}
			transition = true
		}
	}
	if w.egressIP != "" {
		px.Status.EgressIP = w.egressIP
	}
	if last := px.Status.LastHealthCheckTime; !w.confirmed.IsZero() && px.Status.Healthy && (last == nil || last.Before(&w.confirmed)) {
		px.Status.LastHealthCheckTime = &w.confirmed
	}
	if equality.Semantic.DeepEqual(base.Status, px.Status) {
		return w.queued, nil // coalesced: status already says it
	}

	opts := []trace.SpanStartOption{trace.WithAttributes(attribute.String("proxy", w.key.String()), attribute.String("healthy", string(w.verdict.status)))}
	if tp := w.verdict.traceparent; tp != "" && transition {
		remote := otel.GetTextMapPropagator().Extract(context.Background(), propagation.MapCarrier{"traceparent": tp})
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: trace.SpanContextFromContext(remote)}))
	}
	ctx, span := tracer.Start(ctx, "health.Transition", opts...)
	defer span.End()
	wrote, err := statuspatch.New(v1.WriterHealth, e.client).Patch(ctx, base, px)
	switch {
	case apierrors.IsConflict(err):
		return 0, errStale
	case err != nil:
		span.RecordError(err)
		return 0, err
	case !wrote:
		return w.queued, nil // gone
	}
	metrics.StatusWrites.WithLabelValues(v1.WriterHealth.Name).Inc()
	if transition {
		e.announce(px, was, w.verdict)
	}
	return w.queued, nil
}

// announce makes an Event of each health transition, so `kubectl describe`
// tells a proxy's story: health gone stale (probing stopped) and its end,
// and every change between healthy, unhealthy and denied. Like the
// status write, it happens on transitions only, never per probe. A new
// proxy passing its first probes is the expected course, not news (its
// condition says it, as a Pod's Ready does): an Event for each was a
// quarter of a fleet's bring-up writes (decision 119). Failing its first
// probes is news.
func (e *Engine) announce(px *v1.Proxy, was string, v verdict) {
	switch {
	case e.recorder == nil:
	case v.reason == v1.ReasonProbeSucceeded && (was == "" || was == v1.ReasonNotProbed):
	case v.stale():
		e.recorder.Eventf(px, nil, v1.EventType(v1.ReasonProbeStale), v1.ReasonProbeStale, "Probe", "%s", v.msg)
	case was == v1.ReasonProbeStale:
		e.recorder.Eventf(px, nil, v1.EventType(v1.EventProbeResumed), v1.EventProbeResumed, "Probe", "probe results arrive again: %s (%s)", v.reason, v.msg)
	case v.reason == v1.ReasonProbeSucceeded || v.reason == v1.ReasonProbeFailed || v.reason == v1.ReasonProbeDenied:
		e.recorder.Eventf(px, nil, v1.EventType(v.reason), v.reason, "Probe", "%s", v.msg)
	}
}
