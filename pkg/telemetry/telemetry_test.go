package telemetry

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
)

func TestLogLinesInsideASpanCarryTraceAndSpanID(t *testing.T) {
	var spans, logs bytes.Buffer
	shutdown, err := SetupTracing(context.Background(), "test", TracingConfig{Exporter: ExporterConsole, Console: &spans})
	require.NoError(t, err)

	log := NewLogger(&logs, slog.LevelInfo, "test")
	ctx, span := otel.Tracer("t").Start(context.Background(), "op")
	log.InfoContext(ctx, "inside")
	span.End()
	log.InfoContext(context.Background(), "outside")
	require.NoError(t, shutdown(context.Background()))

	lines := bytes.Split(bytes.TrimSpace(logs.Bytes()), []byte("\n"))
	require.Len(t, lines, 2)
	var inside, outside map[string]any
	require.NoError(t, json.Unmarshal(lines[0], &inside))
	require.NoError(t, json.Unmarshal(lines[1], &outside))
	assert.Equal(t, span.SpanContext().TraceID().String(), inside["traceID"])
	assert.Equal(t, span.SpanContext().SpanID().String(), inside["spanID"])
	assert.NotContains(t, outside, "traceID")
	assert.Equal(t, "test", inside["service"])

	assert.Contains(t, spans.String(), `"Name":"op"`, "console exporter printed the span")
	assert.Contains(t, spans.String(), span.SpanContext().TraceID().String())
}

func TestTracingConfigFromEnv(t *testing.T) {
	cases := []struct {
		name, exporter, endpoint, want string
	}{
		{"off by default", "", "", ExporterNone},
		{"endpoint implies otlp", "", "http://collector:4318", ExporterOTLP},
		{"explicit console", "console", "", ExporterConsole},
		{"explicit none wins over endpoint", "none", "http://collector:4318", ExporterNone},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_TRACES_EXPORTER", tc.exporter)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", tc.endpoint)
			t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
			assert.Equal(t, tc.want, TracingConfigFromEnv().Exporter)
		})
	}
	_, err := SetupTracing(context.Background(), "x", TracingConfig{Exporter: "zipkin"})
	assert.ErrorContains(t, err, `OTEL_TRACES_EXPORTER="zipkin"`)
}

// The environment names the service when it says a name; our own name is
// the fallback.
func TestServiceNameFollowsTheEnvironment(t *testing.T) {
	for _, tc := range []struct{ name, serviceName, attrs, want string }{
		{"default", "", "", "broker"},
		{"OTEL_SERVICE_NAME", "prober-eu", "", "prober-eu"},
		{"resource attributes", "", "service.name=prober-us,team=crawl", "prober-us"},
		{"OTEL_SERVICE_NAME wins", "prober-eu", "service.name=prober-us", "prober-eu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("OTEL_SERVICE_NAME", tc.serviceName)
			t.Setenv("OTEL_RESOURCE_ATTRIBUTES", tc.attrs)
			var spans bytes.Buffer
			shutdown, err := SetupTracing(context.Background(), "broker", TracingConfig{Exporter: ExporterConsole, Console: &spans})
			require.NoError(t, err)
			_, span := otel.Tracer("t").Start(context.Background(), "op")
			span.End()
			require.NoError(t, shutdown(context.Background()))
			assert.Contains(t, spans.String(), `"Key":"service.name","Value":{"Type":"STRING","Value":"`+tc.want+`"}`)
		})
	}
}
