package kvm_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
)

// kvm2 records a child span per libvirt RPC under the decorator's span of
// the provider call, the background provisioning included; kvm records
// only the decorator's.
func TestKVM2SpanPerRPC(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(prev) })

	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		p := providers.Instrument(newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{h}, nil)), typ+"-home", typ)
		inst := create(t, p, owner("traced-"+typ), "", "tiny")
		waitState(t, p, inst.ProviderID, providers.StateRunning)
	}

	// Each type's Create is the root of its own trace; name every span in
	// those two traces.
	createTrace := map[string]string{} // trace ID -> type
	for _, s := range rec.Ended() {
		if s.Name() == "provider.Create" {
			createTrace[s.SpanContext().TraceID().String()] = attr(s, "provider.type")
		}
	}
	require.Len(t, createTrace, 2, "the decorator traces both types")
	rpcs := map[string]map[string]int{kvm.Type: {}, kvm.Type2: {}}
	for _, s := range rec.Ended() {
		typ, ok := createTrace[s.SpanContext().TraceID().String()]
		if !ok || s.Name() == "provider.Create" {
			continue
		}
		rpcs[typ][s.Name()]++
		assert.Equal(t, "hv-a", attr(s, "kvm.host"), "%s names its host", s.Name())
	}
	for _, rpc := range []string{"libvirt.DomainDefineXMLFlags", "libvirt.StorageVolUpload", "libvirt.StorageVolCreateXML", "libvirt.DomainCreate"} {
		assert.Positive(t, rpcs[kvm.Type2][rpc], "%s is a span in kvm2's Create trace, the background provisioning included: %v", rpc, rpcs[kvm.Type2])
	}
	assert.Empty(t, rpcs[kvm.Type], "kvm records no RPC spans")
}

func attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.AsString()
		}
	}
	return ""
}
