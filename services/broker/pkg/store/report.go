package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
)

// Refusal is a lease refused for want of capacity, not for a bad request:
// it carries a stable reason, details for the caller and how long to wait.
type Refusal interface {
	error
	Reason() string
	RetryAfter() time.Duration
	Details() map[string]string
}

// Details of a NoCandidateError.
func (e *NoCandidateError) Details() map[string]string {
	return map[string]string{"candidates": strconv.Itoa(e.Candidates), "coolingDown": strconv.Itoa(e.CoolingDown),
		"atCap": strconv.Itoa(e.AtCap), "healthStale": strconv.Itoa(e.Stale), "quarantined": strconv.Itoa(e.Quarantined)}
}

// TargetCapError: the target has its fleet-wide cap of live leases.
type TargetCapError struct {
	Target string
	Cap    int
}

func (e *TargetCapError) Error() string {
	return fmt.Sprintf("target %s has its cap of %d live leases across the fleet (its TargetPolicy's maxConcurrentLeases); release one or wait", e.Target, e.Cap)
}

// Reason is TARGET_AT_CAP.
func (e *TargetCapError) Reason() string { return "TARGET_AT_CAP" }

// RetryAfter: a lease on the target may end any moment.
func (e *TargetCapError) RetryAfter() time.Duration { return time.Second }

// Details of a TargetCapError.
func (e *TargetCapError) Details() map[string]string {
	return map[string]string{"target": e.Target, "maxConcurrentLeases": strconv.Itoa(e.Cap)}
}

// PacedError: the target is paced fleet-wide and its next lease is not
// due yet.
type PacedError struct {
	Target string
	// Rate is the target's current pace, leases per second.
	Rate float64
	// Wait is how long until the next lease is due.
	Wait time.Duration
}

func (e *PacedError) Error() string {
	return fmt.Sprintf("target %s is paced at %.3g leases/s across the fleet (it rate-limited more of the fleet than its cooling limit allows); the next lease is due in %s",
		e.Target, e.Rate, e.Wait.Round(time.Millisecond))
}

// Reason is TARGET_PACED.
func (e *PacedError) Reason() string { return "TARGET_PACED" }

// RetryAfter is when the next lease is due, at least a millisecond.
func (e *PacedError) RetryAfter() time.Duration { return max(e.Wait, time.Millisecond) }

// Details of a PacedError.
func (e *PacedError) Details() map[string]string {
	return map[string]string{"target": e.Target, "ratePerSecond": strconv.FormatFloat(e.Rate, 'g', 4, 64)}
}

// Outcome is how a target treated a leased proxy: the fault table's
// result (pkg/faults).
type Outcome = faults.Result

// Outcomes a report may give.
const (
	OK          = faults.OK
	RateLimited = faults.RateLimited
	Blocked     = faults.Blocked
	// Failed is the proxy's own failure: it counts toward quarantine.
	Failed = faults.Error
	// TargetError is the site's failure through a working proxy: it
	// counts against no proxy.
	TargetError = faults.TargetError
)

// Policy is how reports on one target are acted on.
type Policy struct {
	// CooldownBase is the first cooldown; each one within CooldownWindow of
	// the last one's end doubles it (with jitter), up to CooldownMax.
	CooldownBase, CooldownMax, CooldownWindow time.Duration
	// MaxCoolingFraction of a lease's index may cool down for the target
	// at once; past it the target is paced instead. 1 turns the guard off.
	MaxCoolingFraction float64
	// PacingInitial, PacingMin and PacingMax bound the target's pace in
	// leases per second; reaching PacingMax ends pacing.
	PacingInitial, PacingMin, PacingMax float64
}

// FixedCooldown is the seed's rule: every rate_limited or blocked report
// cools the proxy down for d, with no escalation (the maximum is d) and no
// guard (so no pacing).
func FixedCooldown(d time.Duration) Policy {
	return Policy{CooldownBase: d, CooldownMax: d, CooldownWindow: d, MaxCoolingFraction: 1}
}

// Faults is when error reports quarantine a proxy: on Targets distinct
// targets within Window, for Period. Targets 0 never quarantines.
type Faults struct {
	Targets        int
	Window, Period time.Duration
	// MaxFraction is the largest share of a selector's proxies that may
	// be quarantined at once; past it quarantine holds (QUARANTINE_HELD)
	// and leasing goes on. 0 or 1: no limit.
	MaxFraction float64
}

// Report is one outcome report on a live lease, or (LeaseID empty) on a
// session's last lease for Target, live or ended within the session's
// linger.
type Report struct {
	LeaseID string
	// Session is the (caller-scoped) session key a report without a
	// LeaseID names.
	Session string
	// Owner is the reporting tenant's name: a report on a lease another
	// tenant holds fails with ErrNotOwner.
	Owner string
	// Trusted makes the owner's reports count for every tenant at once;
	// an untrusted owner's count for itself until another tenant agrees
	// (report.lua). Reports without an owner are trusted.
	Trusted bool
	Outcome Outcome
	// Target the report is about (the lease's own when the caller gave none).
	Target string
	Policy Policy
	Faults Faults
}

// Report actions, in the order the script may take them.
const (
	ActionNone              = "NONE"
	ActionCooldownStarted   = "COOLDOWN_STARTED"
	ActionCooldownEscalated = "COOLDOWN_ESCALATED"
	ActionCooldownActive    = "COOLDOWN_ACTIVE"
	ActionCooldownDecayed   = "COOLDOWN_DECAYED"
	ActionGuardHeld         = "GUARD_HELD"
	ActionPacingStarted     = "PACING_STARTED"
	ActionPaceCut           = "PACE_CUT"
	ActionPaceHeld          = "PACE_HELD"
	ActionPaceRaised        = "PACE_RAISED"
	ActionPacingEnded       = "PACING_ENDED"
	ActionQuarantined       = "QUARANTINED"
	ActionQuarantineHeld    = "QUARANTINE_HELD"
	// ActionTenantOnly follows a cooldown that holds for the reporting
	// tenant alone: it is untrusted and no other tenant agreed yet.
	ActionTenantOnly = "TENANT_ONLY"
)

// Verdict is what a report did.
type Verdict struct {
	// CooldownStart and CooldownEnd bound the cooldown the report started
	// or found running (zero: none); CooldownLevel counts its doublings;
	// CooldownShared is how many proxies it covers (those on one exit IP).
	CooldownStart, CooldownEnd    time.Time
	CooldownLevel, CooldownShared int
	// QuarantinedUntil is set while the proxy is quarantined.
	QuarantinedUntil time.Time
	// PaceRate is the target's pace after the report, leases/s (0: unpaced).
	PaceRate float64
	Actions  []string
}

// Report applies an outcome report atomically: escalating cooldowns on
// the proxy's exit IP, the waterfall guard and pacing for the target, and
// fault attribution for the proxy. The lease must be live, and the report
// about its target (a WrongTargetError otherwise).
func (s *Store) Report(ctx context.Context, r Report) (*Verdict, error) {
	ctx, span := s.tracer.Start(ctx, "store.Report", trace.WithAttributes(attribute.String("outcome", string(r.Outcome))))
	defer span.End()
	p, f := r.Policy, r.Faults
	res, err := s.run(ctx, reportScript, r.LeaseID, string(r.Outcome), r.Target,
		p.CooldownBase.Milliseconds(), p.CooldownMax.Milliseconds(), p.CooldownWindow.Milliseconds(), p.MaxCoolingFraction,
		p.PacingInitial, p.PacingMin, p.PacingMax, f.Window.Milliseconds(), f.Targets, f.Period.Milliseconds(), rand.Float64(), f.MaxFraction, r.Session, r.Owner, flag(r.Trusted)).Slice()
	if err != nil {
		return nil, wrap(err)
	}
	if len(res) == 0 {
		return nil, ErrLeaseNotFound
	}
	at := func(i int) time.Time {
		if ms := res[i].(int64); ms > 0 {
			return time.UnixMilli(ms)
		}
		return time.Time{}
	}
	v := &Verdict{CooldownStart: at(0), CooldownEnd: at(1), CooldownLevel: int(res[2].(int64)), CooldownShared: int(res[3].(int64)),
		QuarantinedUntil: at(4)}
	v.PaceRate, _ = strconv.ParseFloat(res[5].(string), 64)
	for _, a := range res[6:] {
		v.Actions = append(v.Actions, a.(string))
	}
	return v, nil
}
