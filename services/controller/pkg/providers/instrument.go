package providers

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

var (
	callDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "proxy_operator_provider_call_duration_seconds",
		Help:    "Duration of provider calls by provider entry, type, method, error kind and caller (lifecycle, gc).",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"provider", "type", "method", "kind", "caller"})
	callErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_provider_errors_total",
		Help: "Provider call errors by provider entry, type, method, typed kind (not_found, quota, invalid_config, transient) and caller (lifecycle, gc).",
	}, []string{"provider", "type", "method", "kind", "caller"})
)

// Collectors are the package's metrics; the controller registers them.
func Collectors() []prometheus.Collector { return []prometheus.Collector{callDuration, callErrors} }

// The callers the decorator tells apart: a Delete by the reconciler is a
// Proxy going away, one by orphan GC is a leak being closed.
const (
	CallerLifecycle = "lifecycle"
	CallerGC        = "gc"
	callerUnknown   = "unknown"
)

type callerKey struct{}

// WithCaller marks ctx's provider calls as made by caller, for the
// decorator's metrics and spans.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

func callerOf(ctx context.Context) string {
	if c, ok := ctx.Value(callerKey{}).(string); ok {
		return c
	}
	return callerUnknown
}

// Instrument wraps p so every call is a span and a metric observation; no
// provider records its own.
func Instrument(p Provider, name, typ string) Provider {
	return &instrumented{p: p, name: name, typ: typ, tracer: otel.Tracer("egress-proxies/providers")}
}

type instrumented struct {
	p         Provider
	name, typ string
	tracer    trace.Tracer
}

func (i *instrumented) observe(ctx context.Context, method string, attrs []attribute.KeyValue, call func(context.Context) error) {
	caller := callerOf(ctx)
	ctx, span := i.tracer.Start(ctx, "provider."+method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(append(attrs, attribute.String("provider.name", i.name), attribute.String("provider.type", i.typ), attribute.String("provider.caller", caller))...))
	start := time.Now()
	err := call(ctx)
	kind := Kind(err)
	callDuration.WithLabelValues(i.name, i.typ, method, kind, caller).Observe(time.Since(start).Seconds())
	if err != nil {
		callErrors.WithLabelValues(i.name, i.typ, method, kind, caller).Inc()
		span.SetAttributes(attribute.String("error.kind", kind))
		// NotFound after a delete is the expected answer, not a failure.
		if kind != "not_found" {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

func (i *instrumented) Create(ctx context.Context, req *CreateRequest) (inst *Instance, err error) {
	i.observe(ctx, "Create", []attribute.KeyValue{attribute.String("instance.name", req.Name)}, func(ctx context.Context) error {
		inst, err = i.p.Create(ctx, req)
		return err
	})
	return inst, err
}

func (i *instrumented) Get(ctx context.Context, id string) (inst *Instance, err error) {
	i.observe(ctx, "Get", []attribute.KeyValue{attribute.String("instance.provider_id", id)}, func(ctx context.Context) error {
		inst, err = i.p.Get(ctx, id)
		return err
	})
	return inst, err
}

func (i *instrumented) Delete(ctx context.Context, id string) (err error) {
	i.observe(ctx, "Delete", []attribute.KeyValue{attribute.String("instance.provider_id", id)}, func(ctx context.Context) error {
		err = i.p.Delete(ctx, id)
		return err
	})
	return err
}

func (i *instrumented) List(ctx context.Context) (out []*Instance, err error) {
	i.observe(ctx, "List", nil, func(ctx context.Context) error {
		out, err = i.p.List(ctx)
		return err
	})
	return out, err
}
