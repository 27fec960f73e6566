// Package garbagecollection sweeps every provider for instances carrying
// our tags whose owning Proxy is gone, or that belong to an older
// generation of a Proxy that has moved on: the safety net for a
// controller that crashed mid-create and for any step the reconciler's
// crash-safety leaves behind.
package garbagecollection

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

var (
	found = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_gc_orphans_found_total",
		Help: "Orphaned instances found by GC sweeps, by provider entry (counted once per sweep that sees them past the grace period).",
	}, []string{"provider"})
	deleted = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_gc_orphans_deleted_total",
		Help: "Orphaned instances GC deleted, by provider entry.",
	}, []string{"provider"})
	sweepErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_gc_sweep_errors_total",
		Help: "Errors during GC sweeps (listing, reading owners, deleting), by provider entry.",
	}, []string{"provider"})
)

// Collectors are the package's metrics; the controller registers them.
func Collectors() []prometheus.Collector { return []prometheus.Collector{found, deleted, sweepErrors} }

// Collector is a manager Runnable; it needs leader election, since only
// the leader may delete.
type Collector struct {
	registry *providers.Registry
	// reader reads Proxies live from the API server: a cache that has
	// not yet seen a new Proxy must never make its instance look orphaned.
	reader client.Reader
	log    *slog.Logger
	opts   Options
}

// Options tune the collector; zero values take the defaults.
type Options struct {
	// Interval is the time between sweeps; 0 means 5 minutes.
	Interval time.Duration
	// Grace protects instances younger than this (their Proxy's status
	// write may still be on its way); 0 means none.
	Grace time.Duration
	// Clock is the sweeps' clock; nil means the real one.
	Clock clock.PassiveClock
}

// New returns a collector of registry's instances whose owners it reads
// through reader, which must not be a cache.
func New(registry *providers.Registry, reader client.Reader, log *slog.Logger, o Options) *Collector {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Collector{registry: registry, reader: reader, log: log, opts: o}
}

// NeedLeaderElection: only the leader sweeps.
func (c *Collector) NeedLeaderElection() bool { return true }

// Start sweeps at once, then every Interval, until ctx ends.
func (c *Collector) Start(ctx context.Context) error {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		c.Sweep(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

var tracer = otel.Tracer("egress-proxies/controller/gc")

// Sweep runs one pass over every usable provider and returns how many
// instances it deleted.
func (c *Collector) Sweep(ctx context.Context) int {
	ctx, span := tracer.Start(providers.WithCaller(ctx, providers.CallerGC), "gc.Sweep")
	defer span.End()
	total := 0
	for name, p := range c.registry.Available() {
		n, err := c.sweepProvider(ctx, name, p)
		total += n
		if err != nil {
			sweepErrors.WithLabelValues(name).Inc()
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
			c.log.ErrorContext(ctx, "gc sweep incomplete", "provider", name, "err", err)
		}
	}
	span.SetAttributes(attribute.Int("gc.deleted", total))
	return total
}

func (c *Collector) sweepProvider(ctx context.Context, name string, p providers.Provider) (int, error) {
	// A partial List still returns what it read; what it could not read
	// is simply not considered, never taken as gone.
	insts, listErr := p.List(ctx)
	n := 0
	var errs []error
	if listErr != nil {
		errs = append(errs, fmt.Errorf("listing: %w", listErr))
	}
	for _, inst := range insts {
		if c.opts.Clock.Since(inst.CreatedAt) < c.opts.Grace {
			continue
		}
		orphan, why, err := c.isOrphan(ctx, inst)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !orphan {
			continue
		}
		found.WithLabelValues(name).Inc()
		c.log.InfoContext(ctx, "deleting orphaned instance", "provider", name, "instance", inst.ProviderID,
			"owner", inst.Owner.Key(), "ownerUID", inst.Owner.UID, "why", why)
		if err := p.Delete(ctx, inst.ProviderID); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", inst.ProviderID, err))
			continue
		}
		deleted.WithLabelValues(name).Inc()
		n++
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("%d errors, first: %w", len(errs), errs[0])
	}
	return n, nil
}

// isOrphan: the owner (matched by UID, not name) is gone, or has moved on
// to a later instance generation. Instances of the owner's current or a
// later generation belong to the reconciler (a later one is a create whose
// status write has not landed).
func (c *Collector) isOrphan(ctx context.Context, inst *providers.Instance) (bool, string, error) {
	if inst.Owner.Namespace == "" || inst.Owner.Name == "" {
		// Tagged with a UID but no name: the UID alone must decide.
		return c.uidGone(ctx, inst)
	}
	px := &v1.Proxy{}
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: inst.Owner.Namespace, Name: inst.Owner.Name}, px)
	switch {
	case apierrors.IsNotFound(err):
		return true, "owner Proxy deleted", nil
	case err != nil:
		return false, "", fmt.Errorf("reading owner of %s: %w", inst.ProviderID, err)
	case px.UID != inst.Owner.UID:
		return true, "owner Proxy deleted (a new Proxy has its name)", nil
	case inst.Owner.Generation < px.Status.InstanceGeneration:
		return true, fmt.Sprintf("generation %d superseded by %d", inst.Owner.Generation, px.Status.InstanceGeneration), nil
	}
	return false, "", nil
}

func (c *Collector) uidGone(ctx context.Context, inst *providers.Instance) (bool, string, error) {
	list := &v1.ProxyList{}
	if err := c.reader.List(ctx, list); err != nil {
		return false, "", err
	}
	for _, px := range list.Items {
		if px.UID == inst.Owner.UID {
			return false, "", nil
		}
	}
	return true, "no Proxy has the owner UID", nil
}
