package leases

import (
	"context"
	"errors"
	"fmt"
	"strings"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// allowReport takes one of the caller's reports from its tenant's
// budget, or says how long to wait. The gateway's reports are not drawn
// from it (access.Caller.Gateway).
func (s *Service) allowReport(c access.Caller) error {
	t := c.Tenant
	if t.Name == "" || c.Gateway {
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

// ReportLease serves LeaseService.ReportLease for c.
func (s *Service) ReportLease(ctx context.Context, c access.Caller, req *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error) {
	outcome := store.Outcome(req.GetResult())
	if err := firstErr(checkLeaseID(req.GetLeaseId()), checkTarget(req.GetTarget()), checkOutcome(outcome),
		checkRange("statusCode", req.GetStatusCode(), 100, 599), checkRange("latencyMs", req.GetLatencyMs(), 0, 3_600_000)); err != nil {
		return nil, err
	}
	if err := s.allowReport(c); err != nil {
		return nil, err
	}
	t := c.Tenant
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
	v, err := s.report(ctx, c, store.Report{LeaseID: req.GetLeaseId(), Owner: t.Name, Trusted: t.Trusted, Outcome: outcome, Target: target}, req.GetStatusCode(), req.GetLatencyMs())
	if errors.Is(err, store.ErrNotOwner) {
		return nil, notOwner(t, req.GetLeaseId())
	}
	return v, err
}

// ReportSession serves LeaseService.ReportSession for c.
func (s *Service) ReportSession(ctx context.Context, c access.Caller, req *leasev1.ReportSessionRequest) (*leasev1.ReportSessionResponse, error) {
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
	if err := s.allowReport(c); err != nil {
		return nil, err
	}
	t := c.Tenant
	r := store.Report{Session: t.Scoped(req.GetSessionKey()), Owner: t.Name, Trusted: t.Trusted, Outcome: outcome, Target: strings.ToLower(req.GetTarget())}
	v, err := s.report(ctx, c, r, req.GetStatusCode(), req.GetLatencyMs())
	if status.Code(err) == codes.NotFound {
		return nil, status.Errorf(codes.NotFound, "session %q has had no lease for target %q in the last 10 minutes (or was another tenant's)", req.GetSessionKey(), r.Target)
	}
	if err != nil {
		return nil, err
	}
	return &leasev1.ReportSessionResponse{CooldownStart: v.CooldownStart, CooldownUntil: v.CooldownUntil, CooldownLevel: v.CooldownLevel,
		CooldownShared: v.CooldownShared, QuarantinedUntil: v.QuarantinedUntil, PacePerSecond: v.PacePerSecond, Actions: v.Actions, Policy: v.Policy}, nil
}

// report applies r (its lease's or session's target resolved) under the
// target's policy.
func (s *Service) report(ctx context.Context, c access.Caller, r store.Report, statusCode, latencyMs int32) (*leasev1.ReportLeaseResponse, error) {
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
	access.Outcomes.WithLabelValues(access.Label(c.Name), string(outcome)).Inc()
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
