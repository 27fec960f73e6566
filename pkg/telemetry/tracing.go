// Package telemetry sets up tracing and logging the same way in every
// service: OpenTelemetry configured only from the standard OTEL_* variables
// and off unless asked for, and JSON logs whose lines inside a span carry
// traceID and spanID.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
)

// Exporter names accepted in OTEL_TRACES_EXPORTER.
const (
	ExporterNone    = "none"
	ExporterConsole = "console"
	ExporterOTLP    = "otlp"
)

// TracingConfig is read from the environment by TracingConfigFromEnv; tests
// build it directly.
type TracingConfig struct {
	// Exporter is none, console or otlp.
	Exporter string
	// Protocol of the OTLP exporter: grpc or http/protobuf.
	Protocol string
	// Console is where the console exporter writes; stdout when nil.
	Console io.Writer
}

// TracingConfigFromEnv follows the OpenTelemetry conventions: tracing is off
// unless OTEL_TRACES_EXPORTER names an exporter or an OTLP endpoint is set.
// Endpoint, headers, sampler and resource attributes are read by the SDK
// itself from their own OTEL_* variables.
func TracingConfigFromEnv() TracingConfig {
	exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))
	if exp == "" {
		exp = ExporterNone
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" {
			exp = ExporterOTLP
		}
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if proto == "" {
		proto = "http/protobuf"
	}
	return TracingConfig{Exporter: exp, Protocol: proto}
}

// SetupTracing installs the global tracer provider and the W3C propagators
// (always, so trace context passes through a service even when it exports
// nothing). The returned function flushes and stops the exporter.
func SetupTracing(ctx context.Context, service string, cfg TracingConfig) (func(context.Context) error, error) {
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))

	var exporter sdktrace.SpanExporter
	var err error
	switch cfg.Exporter {
	case ExporterNone:
		return func(context.Context) error { return nil }, nil
	case ExporterConsole:
		w := cfg.Console
		if w == nil {
			w = os.Stdout
		}
		exporter, err = stdouttrace.New(stdouttrace.WithWriter(w))
	case ExporterOTLP:
		switch cfg.Protocol {
		case "grpc":
			exporter, err = otlptracegrpc.New(ctx)
		case "http/protobuf":
			exporter, err = otlptracehttp.New(ctx)
		default:
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: want grpc or http/protobuf", cfg.Protocol)
		}
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: want none, console or otlp", cfg.Exporter)
	}
	if err != nil {
		return nil, fmt.Errorf("creating %s trace exporter: %w", cfg.Exporter, err)
	}

	res, err := traceResource(service)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// traceResource names the service as the OpenTelemetry environment does
// (OTEL_SERVICE_NAME, or service.name in OTEL_RESOURCE_ATTRIBUTES), so two
// prober fleets can be told apart; only without either is it our own
// name. Later detectors override earlier ones.
func traceResource(service string) (*resource.Resource, error) {
	res, err := resource.New(context.Background(),
		resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrSchemaURLConflict) {
		return nil, fmt.Errorf("building trace resource: %w", err)
	}
	return res, nil
}
