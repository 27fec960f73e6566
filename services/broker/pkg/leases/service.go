// Package leases implements egressproxies.lease.v1.LeaseService on the
// inventory (which proxies exist) and the store (leases, loads, cooldowns).
package leases

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
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
	// Reauthorize, when set, is who holds the credential of the call ctx
	// belongs to now, or why no one may use it any more: an open watch
	// asks it every WatchReauthorize, and ends when the answer, or the
	// scope it gives, changes. docs/security.md promises 10 s.
	Reauthorize      func(ctx context.Context) (*access.Tenant, error)
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

// Service is the LeaseService server.
type Service struct {
	leasev1.UnimplementedLeaseServiceServer
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

type observedKey struct{}

// Observed marks ctx's reports as the broker's own observations (the
// gateway saw the target answer): they are as many as the caller's
// tunnels and requests, which its limits bound, and are not drawn from
// the token's report budget, which bounds what a caller claims. Only
// in-process callers can set it; nothing on the wire maps to it.
func Observed(ctx context.Context) context.Context {
	return context.WithValue(ctx, observedKey{}, true)
}

// allowReport takes one of the caller's reports from its tenant's
// budget, or says how long to wait.
func (s *Service) allowReport(ctx context.Context) error {
	t := access.From(ctx)
	if t.Name == "" || ctx.Value(observedKey{}) != nil {
		return nil
	}
	perSec, source := s.cfg.TokenReportRate, fmt.Sprintf("--token-report-rate %g/s", s.cfg.TokenReportRate)
	burst := max(s.cfg.TokenReportBurst, 1)
	if n := t.Quotas.ReportsPerSecond; n > 0 {
		perSec, burst, source = float64(n), 2*n, fmt.Sprintf("its Tenant's spec.quotas.reportsPerSecond %d/s", n)
	}
	if perSec <= 0 {
		return nil
	}
	l, ok := s.reporters.Load(t.Name)
	if !ok {
		l, _ = s.reporters.LoadOrStore(t.Name, rate.NewLimiter(rate.Limit(perSec), burst))
	}
	lim := l.(*rate.Limiter)
	if lim.Limit() != rate.Limit(perSec) || lim.Burst() != burst {
		lim.SetLimit(rate.Limit(perSec)) // the Tenant's quota changed
		lim.SetBurst(burst)
	}
	r := lim.Reserve()
	wait := r.Delay()
	if wait == 0 {
		return nil
	}
	r.Cancel()
	return overQuota(t.Name, "reports", "TOKEN_REPORT_RATE", fmt.Sprintf("tenant %q is over its report rate (%s): slow down", t.Name, source), wait)
}

// overQuota is the refusal of a call past one of its tenant's quotas
// (limit, as tokenLimited counts it): RESOURCE_EXHAUSTED with reason,
// naming the tenant, and when to retry (0: the caller must first end
// something it holds).
func overQuota(tenant, limit, reason, msg string, retry time.Duration) error {
	tokenLimited.WithLabelValues(tenant, limit).Inc()
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"token": tenant}}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	st, _ := status.New(codes.ResourceExhausted, msg).WithDetails(details...)
	return st.Err()
}

// ErrorDomain is the domain of the ErrorInfo details the service returns.
const ErrorDomain = access.ErrorDomain

var (
	leaseIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)
	keyPattern     = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	hostPattern    = regexp.MustCompile(`^[A-Za-z0-9_]([-A-Za-z0-9_.:\[\]]{0,251}[A-Za-z0-9_\]])?$`)
	requestPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)
	sessionPattern = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,128}$`)
)

func checkRequestID(id string) error {
	if id != "" && !requestPattern.MatchString(id) {
		return invalid("requestId", "must be 1-64 letters, digits, '-', '_', '.' or ':' (a UUID is a good choice)")
	}
	return nil
}

func checkSessionKey(k string) error {
	if k != "" && !sessionPattern.MatchString(k) {
		return invalid("sessionKey", "must be 1-128 letters, digits, '-', '_', '.' or ':'")
	}
	return nil
}

func invalid(field, format string, args ...any) error {
	st := status.New(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
	st, _ = st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: fmt.Sprintf(format, args...)}}})
	return st.Err()
}

func checkLeaseID(id string) error {
	if !leaseIDPattern.MatchString(id) {
		return invalid("leaseID", "must be the 32 lower-case hex characters CreateLease returned")
	}
	return nil
}

func checkSelector(sel map[string]string) error {
	if len(sel) > 32 {
		return invalid("selector", "at most 32 pairs")
	}
	for k, v := range sel {
		if !keyPattern.MatchString(k) {
			return invalid("selector", "key %q must be 1-63 characters of letters, digits, '-', '_' or '.'", k)
		}
		if v == "" {
			return invalid("selector."+k, "must not be empty")
		}
		if len(v) > 63 {
			return invalid("selector."+k, "must be at most 63 characters")
		}
	}
	return nil
}

func checkNamespace(ns string) error {
	if ns == "" {
		return nil
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return invalid("namespace", "%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
	}
	return nil
}

func checkTarget(t string) error {
	if t != "" && !hostPattern.MatchString(t) {
		return invalid("target", "must be a host name such as example.com")
	}
	return nil
}

func (s *Service) ttl(secs int32) (time.Duration, error) {
	if secs == 0 {
		return s.cfg.DefaultTTL, nil
	}
	d := time.Duration(secs) * time.Second
	if d < s.cfg.MinTTL || d > s.cfg.MaxTTL {
		return 0, invalid("ttlSeconds", "must be between %d and %d (0 means the default, %d)",
			int(s.cfg.MinTTL.Seconds()), int(s.cfg.MaxTTL.Seconds()), int(s.cfg.DefaultTTL.Seconds()))
	}
	return d, nil
}

// credentials are what the leased proxy asks for, when this broker may
// hand them out. A Secret it cannot read leaves them out: the proxy
// answers 407, as its probes do, which marks it unhealthy soon enough.
func (s *Service) credentials(ctx context.Context, p inventory.Proxy) *leasev1.ProxyCredentials {
	if !s.cfg.ShareCredentials {
		return nil
	}
	c, err := s.inv.Credentials.Of(ctx, p.CredentialsRef)
	if err != nil {
		slog.WarnContext(ctx, "leasing without the proxy's credentials", "proxy", p.ID, "err", err)
		return nil
	}
	if c.Empty() {
		return nil
	}
	return &leasev1.ProxyCredentials{Username: c.Username, Password: c.Password}
}

// storeError maps store errors to the documented codes.
func storeError(err error) error { return storeErrorFrom(err, access.Limit{}, access.Limit{}) }

func withSource(msg, source string) string {
	if source == "" {
		return msg
	}
	return msg + " (" + source + ")"
}

// storeErrorFrom is storeError for a CreateLease, whose quota refusals
// name where the tenant's quota is set (leases: maxLeases, perMinute:
// leasesPerMinute).
func storeErrorFrom(err error, leases, perMinute access.Limit) error {
	var refused store.Refusal
	var un *store.UnavailableError
	var reused *store.RequestReusedError
	var wrong *store.WrongTargetError
	var capped *store.CallerCapError
	var paced *store.CallerRateError
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		return status.Error(codes.NotFound, "lease not found or expired")
	case errors.As(err, &wrong):
		return invalid("target", "%s", wrong.Error())
	case errors.As(err, &capped):
		return overQuota(capped.Caller, "leases", "TOKEN_LEASE_CAP", withSource(capped.Error(), leases.Source), time.Second)
	case errors.As(err, &paced):
		return overQuota(paced.Caller, "leases_per_minute", "TENANT_LEASE_RATE", withSource(paced.Error(), perMinute.Source), paced.Wait)
	case errors.Is(err, store.ErrFull):
		storeFull.Inc()
		st := status.New(codes.ResourceExhausted, store.ErrFull.Error())
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: "STORE_FULL", Domain: ErrorDomain},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(5 * time.Second)})
		return st.Err()
	case errors.As(err, &reused):
		return status.Error(codes.AlreadyExists, reused.Error())
	case errors.As(err, &refused):
		noCandidate.WithLabelValues(refused.Reason()).Inc()
		st := status.New(codes.ResourceExhausted, "no proxy available: "+refused.Error())
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: refused.Reason(), Domain: ErrorDomain, Metadata: refused.Details()},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(refused.RetryAfter())})
		return st.Err()
	case errors.As(err, &un):
		return status.Error(codes.Unavailable, "lease store unavailable; retry (a CreateLease may have been applied: retry it with the same requestId to get that lease rather than a second one)")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
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

func (s *Service) checkSynced() error {
	if !s.inv.Synced() || !s.pol.Synced() {
		return status.Error(codes.Unavailable, "the proxy inventory or the TargetPolicies have not synced with the API server yet")
	}
	return nil
}

// ListProxies implements LeaseService.
func (s *Service) ListProxies(ctx context.Context, req *leasev1.ListProxiesRequest) (*leasev1.ListProxiesResponse, error) {
	if err := firstErr(checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace()), checkTarget(req.GetTarget())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	c, err := readCursor(req)
	if err != nil {
		return nil, err
	}
	t := access.From(ctx)
	ns, sel, err := t.Scope(req.GetNamespace(), req.GetSelector())
	if err != nil {
		return nil, err
	}
	ps, more := s.inv.Page(ns, sel, req.Healthy, c.after, c.size)
	next := c.next(ps, more)
	uids := make([]string, len(ps))
	for i, p := range ps {
		uids[i] = p.UID
	}
	states, err := s.store.States(ctx, req.GetTarget(), t.Name, uids)
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ListProxiesResponse{Proxies: make([]*leasev1.Proxy, 0, len(ps)), NextPageToken: next}
	for _, p := range ps {
		resp.Proxies = append(resp.Proxies, toProto(p, states[p.UID]))
	}
	return resp, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// attempts bounds how often CreateLease retries after finding the store
// out of step with the inventory (an index to rebuild, a proxy that just
// stopped being leasable).
const attempts = 3

// CreateLease implements LeaseService.
func (s *Service) CreateLease(ctx context.Context, req *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	ttl, err := s.ttl(req.GetTtlSeconds())
	if err := firstErr(err, checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace()), checkTarget(req.GetTarget()),
		checkRequestID(req.GetRequestId()), checkSessionKey(req.GetSessionKey())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	t := access.From(ctx)
	ns, labels, err := t.Scope(req.GetNamespace(), req.GetSelector())
	if err != nil {
		return nil, err
	}
	sel := index.Selector{Namespaces: ns, Labels: labels}
	target := strings.ToLower(req.GetTarget())
	leases := access.LimitOf(t.Quotas.MaxLeases, "maxLeases", s.cfg.TokenMaxLeases, "--token-max-leases")
	perMinute := access.LimitOf(t.Quotas.LeasesPerMinute, "leasesPerMinute", 0, "")
	a := store.Acquire{Target: target, Cap: s.cfg.LeaseCap, TTL: ttl, LeaseID: store.NewLeaseID(), RequestID: access.Scoped(ctx, req.GetRequestId()),
		PerTarget: s.cfg.BanAware, Session: access.Scoped(ctx, req.GetSessionKey()), Caller: t.Name, CallerCap: leases.N, CallerRate: perMinute.N}
	if err := s.selectors.take(t, sel, access.LimitOf(t.Quotas.MaxSelectors, "maxSelectors", s.cfg.TokenMaxSelectors, "--token-max-selectors"), s.idx.Holds); err != nil {
		return nil, err
	}
	if a.PerTarget {
		a.TargetCap = s.pol.For(target).MaxConcurrentLeases
	}
	if a.RequestID != "" {
		// What a request id's retries must repeat: the selector (its index
		// key is a canonical hash of it), the target, the TTL and the session.
		a.Fingerprint = fmt.Sprintf("%s %q %d %q", sel.Key(), target, req.GetTtlSeconds(), a.Session)
	}
	for range attempts {
		if a.Index, err = s.idx.Ensure(ctx, sel); err != nil {
			return nil, storeError(err)
		}
		l, err := s.store.Acquire(ctx, a)
		var stale *store.StaleIndexError
		var none *store.NoCandidateError
		switch {
		case errors.Is(err, store.ErrNoIndex):
			s.idx.Forget(a.Index)
			continue
		case errors.As(err, &stale):
			s.idx.Forget(a.Index) // the rebuild re-adds its cooling members
			continue
		case errors.As(err, &none) && none.Candidates == 0:
			if err := s.explainEmpty(ctx, sel, none); err != nil {
				return nil, storeError(err)
			}
			return nil, storeError(none)
		case errors.As(err, &none):
			// Demand the fleet did not meet: pools with autoscaling grow
			// on it. Counting is best effort; the refusal stands.
			if err := s.store.Refused(ctx, a.Index, s.cfg.Clock.Now()); err != nil {
				refusalsUncounted.Inc()
			}
			return nil, storeError(none)
		case err != nil:
			return nil, storeErrorFrom(err, leases, perMinute)
		}
		p, ok := s.inv.Get(l.Proxy)
		if ok && p.Leasable {
			leasesCreated.Inc()
			return &leasev1.CreateLeaseResponse{LeaseId: l.ID, Proxy: toProto(p, store.State{Load: l.Load}), ExpiresAt: timestamppb.New(l.Expires),
				Credentials: s.credentials(ctx, p), SessionMoved: l.SessionMoved}, nil
		}
		// The index still holds a proxy this broker has seen leave the
		// leasable set: hand the lease back, fix the index, pick again.
		if _, err := s.store.Release(ctx, l.ID, t.Name); err != nil {
			return nil, storeError(err)
		}
		if err := s.idx.Apply(ctx, l.Proxy); err != nil {
			return nil, storeError(err)
		}
		a.LeaseID = store.NewLeaseID()
	}
	return nil, status.Error(codes.Unavailable, "the lease store and this broker's view of the fleet disagree; retry")
}

// explainEmpty says why an index is empty: it runs only when no proxy
// matched, to count the matching proxies whose health is stale (probing
// stopped) and the leasable ones in quarantine.
func (s *Service) explainEmpty(ctx context.Context, sel index.Selector, none *store.NoCandidateError) error {
	var leasable []string
	for _, p := range s.inv.Select(sel.Namespaces, sel.Labels, nil, false) {
		if p.HealthStale {
			none.Stale++
		}
		if p.Leasable {
			leasable = append(leasable, p.UID)
		}
	}
	states, err := s.store.States(ctx, "", "", leasable)
	for _, st := range states {
		if !st.QuarantinedUntil.IsZero() {
			none.Quarantined++
		}
	}
	return err
}

// RenewLease implements LeaseService. A lease is renewed only while its
// proxy is leasable at the address it was leased at.
func (s *Service) RenewLease(ctx context.Context, req *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error) {
	ttl, err := s.ttl(req.GetTtlSeconds())
	if err := firstErr(checkLeaseID(req.GetLeaseId()), err); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	l, err := s.store.Get(ctx, req.GetLeaseId())
	if err != nil {
		return nil, storeError(err)
	}
	if t := access.From(ctx); l.Owner != t.Name {
		return nil, notOwner(t, l.ID)
	}
	until, lost := s.renewable(l)
	if lost == nil {
		l, err = s.store.Renew(ctx, l, ttl, until)
		if errors.Is(err, store.ErrPastUntil) {
			lost = &proxyLost{v1.NotLeasableDraining, "the proxy is draining and its drain deadline has passed"}
		} else if err != nil {
			return nil, storeError(err)
		}
	}
	if lost != nil {
		renewRefused.WithLabelValues(lost.reason).Inc()
		return nil, lost.status()
	}
	leasesRenewed.Inc()
	return &leasev1.RenewLeaseResponse{LeaseId: l.ID, ExpiresAt: timestamppb.New(l.Expires)}, nil
}

// proxyLost says why a lease's proxy can no longer be renewed.
type proxyLost struct{ reason, why string }

func (e *proxyLost) status() error {
	st := status.New(codes.FailedPrecondition, "the lease can no longer be renewed: "+e.why+"; release it and lease another proxy")
	st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: e.reason, Domain: ErrorDomain})
	return st.Err()
}

// renewable says whether l may be renewed, and until when: a draining
// proxy's leases renew up to its drain deadline and no further (the store
// holds them to it by Redis's clock), so the pool can delete it on time
// without cutting a lease short; a cordoned one's renew as before.
func (s *Service) renewable(l *store.Lease) (until time.Time, lost *proxyLost) {
	p, ok := s.inv.Get(l.Proxy)
	if !ok {
		return time.Time{}, &proxyLost{"PROXY_GONE", "the proxy was deleted"}
	}
	reason, why := p.NotLeasable()
	switch {
	case reason == v1.NotLeasableDraining:
		until = p.DrainDeadline
	case reason == v1.NotLeasableCordoned:
	case reason != "":
		return time.Time{}, &proxyLost{reason, why}
	}
	if p.Addr() != l.Addr {
		return time.Time{}, &proxyLost{"PROXY_ADDRESS_CHANGED", fmt.Sprintf("the proxy moved from %s to %s", l.Addr, p.Addr())}
	}
	return until, nil
}

// ReleaseLease implements LeaseService; releasing an unknown or released
// lease succeeds.
func (s *Service) ReleaseLease(ctx context.Context, req *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error) {
	if err := checkLeaseID(req.GetLeaseId()); err != nil {
		return nil, err
	}
	t := access.From(ctx)
	released, err := s.store.Release(ctx, req.GetLeaseId(), t.Name)
	if errors.Is(err, store.ErrNotOwner) {
		return nil, notOwner(t, req.GetLeaseId())
	}
	if err != nil {
		return nil, storeError(err)
	}
	if released {
		leasesReleased.Inc()
	}
	return &leasev1.ReleaseLeaseResponse{}, nil
}

// ReportLease implements LeaseService.
func (s *Service) ReportLease(ctx context.Context, req *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error) {
	outcome := store.Outcome(req.GetResult())
	if err := firstErr(checkLeaseID(req.GetLeaseId()), checkTarget(req.GetTarget()), checkOutcome(outcome),
		checkRange("statusCode", req.GetStatusCode(), 100, 599), checkRange("latencyMs", req.GetLatencyMs(), 0, 3_600_000)); err != nil {
		return nil, err
	}
	if err := s.allowReport(ctx); err != nil {
		return nil, err
	}
	t := access.From(ctx)
	target := strings.ToLower(req.GetTarget())
	if target == "" {
		l, err := s.store.Get(ctx, req.GetLeaseId())
		if err != nil {
			return nil, storeError(err)
		}
		if l.Owner != t.Name {
			return nil, notOwner(t, l.ID)
		}
		if target = l.Target; target == "" && s.needsTarget(outcome) {
			return nil, invalid("target", "is required for %s when the lease was created without one", outcome)
		}
	}
	v, err := s.report(ctx, store.Report{LeaseID: req.GetLeaseId(), Owner: t.Name, Trusted: t.Trusted, Outcome: outcome, Target: target}, req.GetStatusCode(), req.GetLatencyMs())
	if errors.Is(err, store.ErrNotOwner) {
		return nil, notOwner(t, req.GetLeaseId())
	}
	return v, err
}

// ReportSession implements LeaseService.
func (s *Service) ReportSession(ctx context.Context, req *leasev1.ReportSessionRequest) (*leasev1.ReportSessionResponse, error) {
	outcome := store.Outcome(req.GetResult())
	if err := firstErr(checkSessionKey(req.GetSessionKey()), checkTarget(req.GetTarget()), checkOutcome(outcome),
		checkRange("statusCode", req.GetStatusCode(), 100, 599), checkRange("latencyMs", req.GetLatencyMs(), 0, 3_600_000)); err != nil {
		return nil, err
	}
	switch {
	case req.GetSessionKey() == "":
		return nil, invalid("sessionKey", "is required")
	case req.GetTarget() == "":
		return nil, invalid("target", "is required: the host the session leased for")
	}
	if err := s.allowReport(ctx); err != nil {
		return nil, err
	}
	t := access.From(ctx)
	r := store.Report{Session: access.Scoped(ctx, req.GetSessionKey()), Owner: t.Name, Trusted: t.Trusted, Outcome: outcome, Target: strings.ToLower(req.GetTarget())}
	v, err := s.report(ctx, r, req.GetStatusCode(), req.GetLatencyMs())
	if status.Code(err) == codes.NotFound {
		return nil, status.Errorf(codes.NotFound, "session %q has had no lease for target %q in the last 10 minutes (or was another tenant's)", req.GetSessionKey(), r.Target)
	}
	if err != nil {
		return nil, err
	}
	return &leasev1.ReportSessionResponse{CooldownStart: v.CooldownStart, CooldownUntil: v.CooldownUntil, CooldownLevel: v.CooldownLevel,
		CooldownShared: v.CooldownShared, QuarantinedUntil: v.QuarantinedUntil, PacePerSecond: v.PacePerSecond, Actions: v.Actions, Policy: v.Policy}, nil
}

// notOwner refuses a call on a lease another tenant holds. Lease ids are
// 128 random bits: a caller naming another's has it from that tenant.
func notOwner(t *access.Tenant, id string) error {
	return t.Denied("TENANT_LEASE", "lease %s is another tenant's: only the tenant that took a lease renews, reports on or releases it", id)
}

// report applies r (its lease's or session's target resolved) under the
// target's policy.
func (s *Service) report(ctx context.Context, r store.Report, statusCode, latencyMs int32) (*leasev1.ReportLeaseResponse, error) {
	outcome := r.Outcome
	pol := s.pol.For(r.Target)
	r.Policy, r.Faults = pol.Policy, s.cfg.Faults
	if !s.cfg.BanAware {
		// The seed's rule: a fixed cooldown on rate_limited, nothing else.
		r.Policy = store.FixedCooldown(pol.CooldownBase)
		r.Faults = store.Faults{}
		if outcome != store.RateLimited {
			r.Outcome = "" // the script checks the lease and does nothing else
		}
	}
	v, err := s.store.Report(ctx, r)
	if errors.Is(err, store.ErrNotOwner) {
		return nil, err // the caller names the tenant
	}
	if err != nil {
		return nil, storeError(err)
	}
	observeReport(outcome, statusCode, latencyMs, v.Actions)
	access.Outcomes.WithLabelValues(access.Label(access.From(ctx).Name), string(outcome)).Inc()
	return &leasev1.ReportLeaseResponse{
		CooldownStart: timestamp(v.CooldownStart), CooldownUntil: timestamp(v.CooldownEnd),
		CooldownLevel: int32(v.CooldownLevel), CooldownShared: int32(v.CooldownShared),
		QuarantinedUntil: timestamp(v.QuarantinedUntil), PacePerSecond: v.PaceRate, Actions: v.Actions, Policy: pol.Source,
	}, nil
}

// needsTarget: every result but ok is about a target; the seed's rule
// (--ban-aware=false) uses only rate_limited's.
func (s *Service) needsTarget(o store.Outcome) bool {
	return o == store.RateLimited || (s.cfg.BanAware && o != store.OK)
}

func checkOutcome(o store.Outcome) error {
	if o.Valid() {
		return nil
	}
	return invalid("result", "must be one of ok, rate_limited, blocked, error, target_error (got %q)", string(o))
}

// checkRange accepts 0 (not given) or a value in [lo, hi].
func checkRange(field string, v, lo, hi int32) error {
	if v != 0 && (v < lo || v > hi) {
		return invalid(field, "must be between %d and %d, or 0 when unknown (got %d)", lo, hi, v)
	}
	return nil
}

// Bounds of ListRefusals' window.
const (
	defaultRefusalWindow = time.Minute
	maxRefusalWindow     = 10 * time.Minute
)

// ListRefusals implements LeaseService.
func (s *Service) ListRefusals(ctx context.Context, req *leasev1.ListRefusalsRequest) (*leasev1.ListRefusalsResponse, error) {
	window := time.Duration(req.GetWindowSeconds()) * time.Second
	switch {
	case window == 0:
		window = defaultRefusalWindow
	case window < time.Second || window > maxRefusalWindow:
		return nil, invalid("windowSeconds", "must be between 1 and %d (got %d)", int(maxRefusalWindow.Seconds()), req.GetWindowSeconds())
	}
	t := access.From(ctx)
	counts, err := s.store.Refusals(ctx, window, s.cfg.Clock.Now())
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ListRefusalsResponse{}
	for def, n := range counts {
		var sel index.Selector
		if err := json.Unmarshal([]byte(def), &sel); err != nil {
			continue // not an index this broker version wrote
		}
		if !t.SeesAll(sel.Namespaces) {
			continue // another tenant's demand is not this one's to see
		}
		resp.Selectors = append(resp.Selectors, &leasev1.SelectorRefusals{Namespace: strings.Join(sel.Namespaces, ","), Selector: sel.Labels, Refused: n})
	}
	sort.Slice(resp.Selectors, func(i, j int) bool {
		a, b := resp.Selectors[i], resp.Selectors[j]
		if a.Refused != b.Refused {
			return a.Refused > b.Refused
		}
		return fmt.Sprint(a.Namespace, a.Selector) < fmt.Sprint(b.Namespace, b.Selector)
	})
	return resp, nil
}
