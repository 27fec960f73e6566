package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// Acquire is one lease request against a selector index.
type Acquire struct {
	Index  string
	Target string
	// Cap is the most live leases one proxy may hold; 0: no cap.
	Cap int
	TTL time.Duration
	// LeaseID names the new lease; a retry with the same id (go-redis
	// retries a script after a read timeout) returns the lease the first
	// try made instead of making a second.
	LeaseID string
	// RequestID, when set, makes a client's retry return the lease its
	// first try made, for as long as that lease lives; Fingerprint (the
	// request's other parameters) tells a retry from a reuse.
	RequestID, Fingerprint string
	// PerTarget counts the target's live leases fleet-wide and applies
	// its TargetCap and pace, and keeps Session sticky.
	PerTarget bool
	// TargetCap is the most live leases for Target fleet-wide; 0: no cap.
	TargetCap int
	// Session, when set, leases the proxy of the session's live leases
	// while it qualifies (in the index, below Cap, not cooling down).
	Session string
	// Caller names the tenant the lease is taken for ("" for none, which
	// no cap applies to); it may hold at most CallerCap live leases (0: no
	// cap) and take CallerRate leases a minute, fleet-wide (0: no limit).
	Caller                string
	CallerCap, CallerRate int
}

// Acquire atomically leases the least-loaded proxy of the index that is
// not cooling down for the target and is below the cap, ties broken
// uniformly at random. Scripts run one at a time in Redis, so with any
// number of brokers no proxy passes its cap.
func (s *Store) Acquire(ctx context.Context, a Acquire) (*Lease, error) {
	ctx, span := s.tracer.Start(ctx, "store.Acquire", trace.WithAttributes(attribute.String("index", a.Index)))
	defer span.End()
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	res, err := s.run(ctx, acquireScript, a.Index, a.Target, a.Cap, a.TTL.Milliseconds(), a.LeaseID,
		binary.BigEndian.Uint64(rnd[:])>>12, a.RequestID, a.Fingerprint, a.TargetCap, a.Session, flag(a.PerTarget), a.Caller, a.CallerCap, a.CallerRate).Slice()
	if err != nil {
		return nil, wrap(err)
	}
	switch res[0] {
	case "ok":
		return &Lease{ID: res[4].(string), Proxy: res[1].(string), Target: a.Target, Expires: time.UnixMilli(res[2].(int64)),
			Load: int(res[3].(int64)), SessionMoved: res[5].(int64) == 1}, nil
	case "none":
		return nil, &NoCandidateError{Candidates: int(res[1].(int64)), CoolingDown: int(res[2].(int64)), AtCap: int(res[3].(int64))}
	case "noindex":
		return nil, ErrNoIndex
	case "reused":
		return nil, &RequestReusedError{LeaseID: res[1].(string)}
	case "stale":
		return nil, &StaleIndexError{Proxy: res[1].(string)}
	case "tcap":
		return nil, &TargetCapError{Target: a.Target, Cap: a.TargetCap}
	case "ccap":
		return nil, &CallerCapError{Caller: a.Caller, Cap: a.CallerCap, Live: int(res[1].(int64))}
	case "crate":
		return nil, &CallerRateError{Caller: a.Caller, Rate: a.CallerRate, Wait: time.Duration(res[1].(int64)) * time.Millisecond}
	case "paced":
		rate, _ := strconv.ParseFloat(res[2].(string), 64)
		return nil, &PacedError{Target: a.Target, Rate: rate, Wait: time.Duration(res[1].(int64)) * time.Millisecond}
	}
	return nil, fmt.Errorf("acquire script: unexpected reply %v", res)
}

// Get returns a live lease.
func (s *Store) Get(ctx context.Context, id string) (*Lease, error) {
	res, err := s.run(ctx, getScript, id).Slice()
	if err != nil {
		return nil, wrap(err)
	}
	if len(res) == 0 {
		return nil, ErrLeaseNotFound
	}
	return &Lease{ID: id, Proxy: res[0].(string), Target: res[1].(string), Expires: time.UnixMilli(res[2].(int64)), Addr: res[3].(string), Owner: res[4].(string)}, nil
}

// Renew extends a live lease on proxy (a UID) to now+ttl, and no further
// than until unless it is zero (a draining proxy's deadline); now is
// Redis's clock, as for every expiry, so brokers' clocks do not matter.
func (s *Store) Renew(ctx context.Context, l *Lease, ttl time.Duration, until time.Time) (*Lease, error) {
	ctx, span := s.tracer.Start(ctx, "store.Renew")
	defer span.End()
	var cap int64
	if !until.IsZero() {
		cap = max(until.UnixMilli(), 1) // the epoch (an unreadable deadline) has passed too
	}
	exp, err := s.run(ctx, renewScript, l.ID, l.Proxy, ttl.Milliseconds(), cap).Int64()
	if err != nil {
		return nil, wrap(err)
	}
	switch exp {
	case 0:
		return nil, ErrLeaseNotFound
	case -1:
		return nil, ErrPastUntil
	}
	r := *l
	r.Expires = time.UnixMilli(exp)
	return &r, nil
}

// Release ends a lease owner holds; releasing an unknown lease is not an
// error, one another tenant holds is ErrNotOwner. It reports whether a
// live lease was released.
func (s *Store) Release(ctx context.Context, id, owner string) (bool, error) {
	ctx, span := s.tracer.Start(ctx, "store.Release")
	defer span.End()
	n, err := s.run(ctx, releaseScript, id, owner).Int64()
	switch {
	case err != nil:
		return false, wrap(err)
	case n < 0:
		return false, ErrNotOwner
	}
	return n == 1, nil
}

// batch bounds the arguments of one script call.
const batch = 500

// State is what the store keeps of one proxy that clients see.
type State struct {
	// Load is its live lease count.
	Load int
	// QuarantinedSince and QuarantinedUntil bound the quarantine error
	// reports on several targets put it in (zero: none).
	QuarantinedSince, QuarantinedUntil time.Time
	// CooldownUntil ends its cooldown for the target States was asked
	// about (zero: none, or no target named): the fleet's, or the
	// tenant's own if that ends later.
	CooldownUntil time.Time
}

// States returns the state of each proxy (by UID); with a target, their
// cooldowns for it too, as tenant sees them ("": the fleet's alone).
func (s *Store) States(ctx context.Context, target, tenant string, proxies []string) (map[string]State, error) {
	out := make(map[string]State, len(proxies))
	for lo := 0; lo < len(proxies); lo += batch {
		chunk := proxies[lo:min(lo+batch, len(proxies))]
		args := make([]any, 0, len(chunk)+2)
		args = append(args, target, tenant)
		for _, p := range chunk {
			args = append(args, p)
		}
		res, err := s.run(ctx, loadsScript, args...).Slice()
		if err != nil {
			return nil, wrap(err)
		}
		for i, p := range chunk {
			r := res[4*i : 4*i+4]
			st := State{Load: int(r[0].(int64))}
			if q := r[2].(int64); q > 0 {
				st.QuarantinedSince, st.QuarantinedUntil = time.UnixMilli(r[1].(int64)), time.UnixMilli(q)
			}
			if c := r[3].(int64); c > 0 {
				st.CooldownUntil = time.UnixMilli(c)
			}
			out[p] = st
		}
	}
	return out, nil
}
