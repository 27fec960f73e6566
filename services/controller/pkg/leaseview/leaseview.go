// Package leaseview is the controller's read-only view of live leases: how
// many each Proxy holds, polled from the broker's own ListProxies. The
// broker keeps lease state in Redis behind its API; reading it through
// that API keeps the Redis layout the broker's private business and needs
// no second Redis client (decision 64, docs/decisions/controller-pools.md).
package leaseview

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// Snapshot is the live-lease count of every Proxy at one moment.
type Snapshot struct {
	// At is when the broker answered; the zero time means no answer yet.
	At time.Time
	// Leases holds the count per proxy id ("namespace/name"); a Proxy
	// the broker does not know holds none.
	Leases map[string]int32
	// Refusals are the selectors whose leases were refused (every match
	// at its cap or cooling down) in the last RefusalWindow.
	Refusals []Refusal
}

// Refusal is unmet demand for one selector.
type Refusal struct {
	Namespace string
	Selector  map[string]string
	Count     int64
}

// RefusalWindow is how far back refusals are read.
const RefusalWindow = time.Minute

// Refused sums the refusals a proxy in namespace with attributes would
// have met: those whose namespace is empty or its own and whose selector
// its attributes contain.
func (s Snapshot) Refused(namespace string, attributes map[string]string) int64 {
	var n int64
	for _, r := range s.Refusals {
		if r.Namespace != "" && r.Namespace != namespace {
			continue
		}
		match := true
		for k, v := range r.Selector {
			if attributes[k] != v {
				match = false
				break
			}
		}
		if match {
			n += r.Count
		}
	}
	return n
}

// Known reports whether the snapshot came from an answer.
func (s Snapshot) Known() bool { return !s.At.IsZero() }

// Source gives the latest snapshot.
type Source interface {
	Snapshot() Snapshot
}

// None is the source of a controller without a broker: nobody holds a
// lease, as of now.
type None struct{}

// Snapshot implements Source.
func (None) Snapshot() Snapshot { return Snapshot{At: time.Now()} }

var pollErrors = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "proxy_operator_leaseview_poll_errors_total",
	Help: "Failed reads of live leases from the broker.",
})

// Collectors are the package's metrics; the controller registers them.
func Collectors() []prometheus.Collector { return []prometheus.Collector{pollErrors} }

// Poller reads every Proxy's live leases from the broker each interval.
// It runs on the leader only, as the pools it feeds do.
type Poller struct {
	api         leasev1.LeaseServiceClient
	log         *slog.Logger
	opts        PollerOptions
	changed     func(ids []string)
	polled      func()
	quarantined func(since map[string]time.Time)

	mu   sync.RWMutex
	snap Snapshot
}

// PollerOptions tune the poller; zero values take the defaults.
type PollerOptions struct {
	// Interval is the time between polls; 0 means 5 seconds.
	Interval time.Duration
	// Namespace limits the poll to one namespace; "" means all.
	Namespace string
	// Clock stamps each snapshot; nil is the wall clock.
	Clock clock.PassiveClock
}

// NewPoller returns a poller of api that, after every answer, tells
// changed the ids ("namespace/name") whose count changed (when any did),
// calls polled (demand may have changed anywhere), and gives quarantined
// the proxies the brokers quarantined and since when, by id. Every hook is
// required: a poll nobody hears is a bug.
func NewPoller(api leasev1.LeaseServiceClient, log *slog.Logger, o PollerOptions,
	changed func(ids []string), polled func(), quarantined func(since map[string]time.Time)) *Poller {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Poller{api: api, log: log, opts: o, changed: changed, polled: polled, quarantined: quarantined}
}

// Snapshot implements Source. Until the first answer it is not Known;
// after a failed poll it keeps the last answer, whose At says how old it
// is.
func (p *Poller) Snapshot() Snapshot {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.snap
}

// Start polls until ctx ends.
func (p *Poller) Start(ctx context.Context) error {
	t := time.NewTicker(p.opts.Interval)
	defer t.Stop()
	for {
		p.poll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (p *Poller) poll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.Interval)
	defer cancel()
	next := Snapshot{At: p.opts.Clock.Now(), Leases: map[string]int32{}}
	quarantined := map[string]time.Time{}
	// Page by page: one list of a large fleet would pass gRPC's message
	// limit.
	for px, err := range leaseclient.AllProxies(ctx, p.api, &leasev1.ListProxiesRequest{Namespace: p.opts.Namespace}) {
		if err != nil {
			pollErrors.Inc()
			if ctx.Err() == nil {
				p.log.WarnContext(ctx, "reading live leases from the broker", "err", err)
			}
			return
		}
		if n := px.GetLeaseCount(); n > 0 {
			next.Leases[px.GetId()] = n
		}
		if px.QuarantinedSince != nil {
			quarantined[px.GetId()] = px.GetQuarantinedSince().AsTime()
		}
	}
	p.quarantined(quarantined)
	refused, err := p.api.ListRefusals(ctx, &leasev1.ListRefusalsRequest{WindowSeconds: int32(RefusalWindow / time.Second)})
	switch {
	case status.Code(err) == codes.Unimplemented:
		// A broker older than ListRefusals: leases only.
	case err != nil:
		pollErrors.Inc()
		p.log.WarnContext(ctx, "reading refused leases from the broker", "err", err)
	default:
		for _, r := range refused.GetSelectors() {
			next.Refusals = append(next.Refusals, Refusal{Namespace: r.GetNamespace(), Selector: r.GetSelector(), Count: r.GetRefused()})
		}
	}
	p.mu.Lock()
	prev := p.snap
	p.snap = next
	p.mu.Unlock()
	p.polled()
	var changed []string
	for id, n := range next.Leases {
		if prev.Leases[id] != n {
			changed = append(changed, id)
		}
	}
	for id := range prev.Leases {
		if _, ok := next.Leases[id]; !ok {
			changed = append(changed, id)
		}
	}
	if len(changed) > 0 {
		p.changed(changed)
	}
}
