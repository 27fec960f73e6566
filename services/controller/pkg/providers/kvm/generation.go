package kvm

import (
	"context"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// generation is everything in which kvm and kvm2 differ; the rest of the
// package is one libvirt core serving both.
type generation struct {
	// typ is the providers-config type, and the providerID scheme.
	typ string
	// metadataURI namespaces the ownership tags in each domain's
	// <metadata>. The two types use different URIs, so neither reads the
	// other's domains as its own.
	metadataURI string
	// traced records a child span per libvirt call (kvm2), named after its
	// RPC (a lookup by name rides along).
	traced bool
	// precheckPool reports a pool without room for a VM as the contract's
	// quota kind before anything is created (kvm2).
	precheckPool bool
	// rereadCredentials reads the SSH key and known_hosts on every dial
	// (kvm2); otherwise once, when the provider is built.
	rereadCredentials bool
	// separateLanes gives image downloads and health checks connections
	// of their own (kvm2); otherwise every call shares one per host.
	separateLanes bool
	// asyncCreate returns from Create once the domain is defined and
	// provisions it in the background, the reconciler polling Get (kvm2);
	// otherwise Create waits until the VM has started.
	asyncCreate bool
}

var (
	gen1 = &generation{
		typ:         "kvm",
		metadataURI: "https://crawl.example.com/egress-proxies/kvm/v1",
	}
	gen2 = &generation{
		typ:               "kvm2",
		metadataURI:       "https://crawl.example.com/egress-proxies/kvm2/v1",
		traced:            true,
		precheckPool:      true,
		rereadCredentials: true,
		separateLanes:     true,
		asyncCreate:       true,
	}
)

// lane maps a lane to the connection that carries it.
func (g *generation) lane(l lane) lane {
	if g.separateLanes {
		return l
	}
	return laneRPC
}

// startSpan starts a child span when this generation traces its RPCs; the
// span is nil otherwise.
func (g *generation) startSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if !g.traced {
		return ctx, nil
	}
	// The tracer is looked up per call, not kept: a tracer taken before
	// the process set its provider stays bound to the first one set.
	return otel.Tracer("egress-proxies/providers/kvm2").Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
}
