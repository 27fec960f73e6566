// Package leases implements egressproxies.lease.v1.LeaseService on the
// inventory (which proxies exist) and the store (leases, loads, cooldowns).
package leases

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/utils/clock"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Config bounds leases.
type Config struct {
	// Clock dates refusals and selectors' use; nil is the wall clock.
	// Tests step a fake one. Leases, cooldowns and quarantines are timed
	// by Redis's own clock, one for every broker.
	Clock clock.PassiveClock
	// DefaultTTL applies when a request's ttlSeconds is 0.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound ttlSeconds.
	MinTTL, MaxTTL time.Duration
	// BanAware turns on what outcome reports drive beyond the seed's fixed
	// cooldown on rate_limited: escalation by exit IP, the waterfall guard
	// and pacing, target caps, sticky sessions and quarantine.
	BanAware bool
	// Faults is when error reports quarantine a proxy.
	Faults store.Faults
	// LeaseCap is the most live leases one proxy may hold; 0 means no cap.
	LeaseCap int
	// ShareCredentials puts a proxy's credentials in the lease; the
	// broker sets it only when callers must present a bearer token, so
	// credentials never leave over an API anyone can call.
	ShareCredentials bool
	// TokenMaxLeases is the most live leases one tenant holds,
	// fleet-wide (0: no cap); TokenReportRate and TokenReportBurst bound
	// each tenant's outcome reports per second on each broker (0: no
	// limit). One leaked or buggy credential can then neither hold the
	// fleet nor report it into cooldowns. A Tenant's spec.quotas override
	// them, and set the quotas that have no flag.
	TokenMaxLeases   int
	TokenReportRate  float64
	TokenReportBurst int
	// TokenMaxWatches is the most WatchProxies streams one tenant holds
	// open on each broker (0: no cap).
	TokenMaxWatches int
	// TokenMaxSelectors is the most distinct selectors one tenant leases
	// with on each broker within an index's idle time (0: no cap).
	TokenMaxSelectors int
	// WatchSendTimeout bounds each batch's send to a watcher: one whose
	// stream does not take a batch within it (it stopped reading, and
	// flow control holds the send) is ended, so it pins neither its
	// batches nor its goroutine. Quiet gaps between batches are not timed.
	WatchSendTimeout time.Duration
	// Reauthorize, when set, is the caller of a watch as its credential
	// stands now, or why no one may use it any more: an open watch asks
	// it every WatchReauthorize, and ends when the answer, or the scope
	// it gives, changes. docs/security.md promises 10 s.
	Reauthorize      func(access.Caller) (access.Caller, error)
	WatchReauthorize time.Duration
}

// DefaultConfig is what the flags default to.
var DefaultConfig = Config{DefaultTTL: 5 * time.Minute, MinTTL: 10 * time.Second, MaxTTL: time.Hour, LeaseCap: 10, BanAware: true,
	Faults:         store.Faults{Targets: 3, Window: 10 * time.Minute, Period: 30 * time.Minute, MaxFraction: 0.3},
	TokenMaxLeases: 10000, TokenReportRate: 200, TokenReportBurst: 400, TokenMaxWatches: 64, TokenMaxSelectors: 64,
	WatchSendTimeout: 30 * time.Second, WatchReauthorize: 5 * time.Second}

// DefaultPolicy is what the flags default to where no TargetPolicy matches.
var DefaultPolicy = policy.Target{Policy: store.Policy{CooldownBase: 15 * time.Minute, CooldownMax: 4 * time.Hour, CooldownWindow: time.Hour,
	MaxCoolingFraction: 0.5, PacingInitial: 1, PacingMin: 0.1, PacingMax: 20}}

// Service is LeaseService's calls, each made by an access.Caller its
// transport established: GRPC serves it over gRPC and REST; the proxy
// gateway calls it directly.
type Service struct {
	inv   *inventory.Inventory
	store *store.Store
	idx   *index.Maintainer
	pol   *policy.Policies
	cfg   Config
	// reporters holds each tenant's report limiter (name -> *rate.Limiter).
	reporters sync.Map
	selectors *selectorBudget
	hub       *hub
}

// New returns a Service.
func New(inv *inventory.Inventory, st *store.Store, idx *index.Maintainer, pol *policy.Policies, cfg Config) *Service {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.WatchSendTimeout <= 0 {
		cfg.WatchSendTimeout = DefaultConfig.WatchSendTimeout
	}
	if cfg.WatchReauthorize <= 0 {
		cfg.WatchReauthorize = DefaultConfig.WatchReauthorize
	}
	s := &Service{inv: inv, store: st, idx: idx, pol: pol, cfg: cfg, selectors: newSelectorBudget(idx.IdleTime(), cfg.Clock)}
	s.hub = newHub(inv, s.views)
	return s
}

func (s *Service) checkSynced() error {
	if !s.inv.Synced() || !s.pol.Synced() {
		return status.Error(codes.Unavailable, "the proxy inventory or the TargetPolicies have not synced with the API server yet")
	}
	return nil
}

func toProto(p inventory.Proxy, st store.State) *leasev1.Proxy {
	return &leasev1.Proxy{Id: p.ID, Ip: p.IP, Port: p.Port, Attributes: p.Attributes, Healthy: p.Healthy, LeaseCount: int32(st.Load), EgressIp: p.EgressIP,
		QuarantinedSince: timestamp(st.QuarantinedSince), QuarantinedUntil: timestamp(st.QuarantinedUntil), CooldownUntil: timestamp(st.CooldownUntil),
		NotLeasable: p.Reason, Pool: p.Pool}
}

// timestamp is t, or nil when t is zero.
func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}
