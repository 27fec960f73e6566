package store

import (
	"errors"
	"fmt"
	"time"
)

// ErrLeaseNotFound: unknown or expired lease.
var ErrLeaseNotFound = errors.New("lease not found or expired")

// ErrNoIndex: the selector index is not in Redis (never built, or dropped
// as idle); build it with Join and retry.
var ErrNoIndex = errors.New("selector index not in the store")

// NoCandidateError says why no proxy could be leased.
type NoCandidateError struct {
	Candidates, CoolingDown, AtCap int
	// Stale counts matching proxies left out because their health is
	// stale (no recent probe result), and Quarantined those left out after
	// error reports; they matter when no candidate is left.
	Stale, Quarantined int
}

func (e *NoCandidateError) Error() string {
	switch {
	case e.Candidates == 0 && e.Stale > 0:
		return fmt.Sprintf("no healthy Ready proxy matches the selector: the health of %d matching proxies is stale (the controller has had no probe result for them lately, so probing has stopped; check the probers)", e.Stale)
	case e.Candidates == 0 && e.Quarantined > 0:
		return fmt.Sprintf("every matching proxy is quarantined (%d): error reports on several targets within the quarantine window blamed them; each returns when its quarantine ends or it next turns healthy", e.Quarantined)
	case e.Candidates == 0:
		return "no healthy Ready proxy matches the selector"
	}
	return fmt.Sprintf("all %d matching proxies are unavailable: %d cooling down for the target, %d at the lease cap", e.Candidates, e.CoolingDown, e.AtCap)
}

// RetryAfter is how long a refused caller should wait: a lease frees a
// proxy at the cap, or a cooldown ends, any moment; when nothing matches,
// or only proxies whose health is stale or that are quarantined, it waits
// for the fleet to change.
func (e *NoCandidateError) RetryAfter() time.Duration {
	if e.Candidates == 0 {
		return 10 * time.Second
	}
	return time.Second
}

// Reason is a stable machine-readable reason.
func (e *NoCandidateError) Reason() string {
	switch {
	case e.Candidates == 0 && e.Stale > 0:
		return "HEALTH_STALE"
	case e.Candidates == 0 && e.Quarantined > 0:
		return "ALL_QUARANTINED"
	case e.Candidates == 0:
		return "NO_MATCHING_PROXY"
	case e.AtCap == 0:
		return "ALL_COOLING_DOWN"
	case e.CoolingDown == 0:
		return "ALL_AT_CAP"
	default:
		return "ALL_COOLING_DOWN_OR_AT_CAP"
	}
}

// RequestReusedError: a request id already names a lease made with other
// parameters.
type RequestReusedError struct{ LeaseID string }

func (e *RequestReusedError) Error() string {
	return "requestId already names a live lease created with a different selector, namespace, target or ttlSeconds"
}

// StaleIndexError: an index offered a proxy that is cooling down for the
// target, so the index is out of step with the cooldowns; nothing was
// written. Rebuild the index and retry.
type StaleIndexError struct{ Proxy string }

func (e *StaleIndexError) Error() string {
	return "selector index out of step with the cooldowns of proxy " + e.Proxy
}

// WrongTargetError: a report named another target than its lease's. A
// report counts only for its lease's target, so one holder cannot cool a
// proxy down, or quarantine it, for targets it never crawled through it.
type WrongTargetError struct{ Leased string }

func (e *WrongTargetError) Error() string {
	return fmt.Sprintf("the lease is for target %q; a report counts only for its lease's target (a lease taken without one is bound to the first target a report names)", e.Leased)
}

// CallerCapError: the caller (a named token) holds its cap of live leases.
type CallerCapError struct {
	Caller    string
	Cap, Live int
}

func (e *CallerCapError) Error() string {
	return fmt.Sprintf("tenant %q holds %d live leases, its cap of %d: release some first", e.Caller, e.Live, e.Cap)
}

// CallerRateError: the caller took its leases for this minute.
type CallerRateError struct {
	Caller string
	Rate   int
	// Wait is how long until the next minute.
	Wait time.Duration
}

func (e *CallerRateError) Error() string {
	return fmt.Sprintf("tenant %q took its %d leases this minute; the next minute starts in %s", e.Caller, e.Rate, e.Wait.Round(time.Millisecond))
}

// ErrFull: Redis is at its maxmemory (noeviction) and refuses anything
// that would grow it; leases still end, which is how room comes back.
var ErrFull = errors.New("the lease store is full (Redis is at its maxmemory): no new lease, cooldown or index until leases end or Redis is given more memory")

// UnavailableError wraps a Redis failure.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "lease store unavailable: " + e.Err.Error() }

func (e *UnavailableError) Unwrap() error { return e.Err }

// ErrPastUntil: a renewal's until had passed, by Redis's clock.
var ErrPastUntil = errors.New("the lease may not be renewed past its proxy's deadline, which has passed")

// ErrNotOwner: the lease is another tenant's.
var ErrNotOwner = errors.New("the lease is another tenant's")
