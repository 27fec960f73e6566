// Package store keeps every lease, per-proxy load, cooldown and selector
// index in Redis, so any broker replica, or a restarted one, sees the same
// state, and every decision is one atomic script on Redis's clock.
//
// The keys, their types, TTLs and writers are declared in schema.go,
// which the scripts take their key names from.
//
// lib.lua explains how an index answers "least loaded, not cooling, below
// the cap, random among ties" in time independent of the fleet's size.
package store

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

// DefaultPrefix holds every key under one hash tag.
const DefaultPrefix = "{ep}:"

var (
	//go:embed lib.lua
	libSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed get.lua
	getSrc string
	//go:embed report.lua
	reportSrc string
	//go:embed join.lua
	joinSrc string
	//go:embed leave.lua
	leaveSrc string
	//go:embed drop.lua
	dropSrc string
	//go:embed loads.lua
	loadsSrc string

	acquireScript = batched(grows, 14, acquireSrc)
	renewScript   = script(shrinks, renewSrc)
	releaseScript = batched(shrinks, 2, releaseSrc)
	getScript     = script(reads, getSrc)
	reportScript  = script(grows, reportSrc)
	joinScript    = script(grows, joinSrc)
	leaveScript   = script(shrinks, leaveSrc)
	dropScript    = script(shrinks, dropSrc)
	loadsScript   = script(shrinks, loadsSrc) // applies what is due first
)

// A script's flags (Redis 7's shebang). Out of memory (maxmemory with
// noeviction), Redis refuses a script that grows the data set before it
// runs; without flags it would refuse only a first write that grows, and
// let one past the limit that first deleted something (an expiry). Those
// that end leases run in any case: they are how memory comes back.
const (
	grows   = "#!lua"
	shrinks = "#!lua flags=allow-oom"
	reads   = "#!lua flags=no-writes"
)

func script(flags, body string) *redis.Script {
	return redis.NewScript(flags + "\n" + luaKeys + libSrc + "\n" + body)
}

// arity is how many arguments one call of each batched script takes.
var arity = map[*redis.Script]int{}

// batched builds a script from a body that defines one(...), the work of
// one call, so that concurrent calls go to Redis as one: the script takes
// the arguments of any number of calls, n each, decides each in turn as
// if alone, and answers the list of their replies. A script call costs
// Redis about as much again as an acquire's own work (the prelude, the
// clock, the drain of what is due, the call itself); the calls of a batch
// share one. Its body reads the clock as NOW, and MORE says whether more
// was due than one drain applies.
func batched(flags string, n int, body string) *redis.Script {
	sc := script(flags, "local NOW = now_ms()\nlocal MORE = drain(NOW, DRAIN)\n"+body+fmt.Sprintf(`
local out = {}
for i = 1, #ARGV, %d do
  out[#out + 1] = one(unpack(ARGV, i, i + %d))
end
return out`, n, n-1))
	arity[sc] = n
	return sc
}

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

// Wait makes every write wait for replicas (Redis WAIT), trading latency
// for not losing a lease to a failover: replication is asynchronous.
type Wait struct {
	// Replicas to wait for; 0 waits for none.
	Replicas int
	// Timeout bounds the wait. A change not acknowledged in time fails as
	// unavailable (though Redis applied it, and a retry finds it), and is
	// counted in proxy_operator_broker_redis_wait_shortfalls_total.
	Timeout time.Duration
}

// ClientOptions are the broker's Redis client options: one address, or
// Sentinels with master set, or Cluster nodes. Timeouts are short, so a
// dead Redis turns into a quick 503, not a hung crawler; go-redis retries
// once, which every script tolerates (they are idempotent).
func ClientOptions(addrs []string, master string) *redis.UniversalOptions {
	return &redis.UniversalOptions{Addrs: addrs, MasterName: master,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, MaxRetries: 1}
}

// Store is the Redis-backed lease store.
type Store struct {
	rdb    redis.UniversalClient
	prefix string
	route  []string
	tracer trace.Tracer
	// Wait, when Replicas > 0, applies to every script that writes.
	Wait Wait
	// calls feeds Pipeline's senders; nil makes each call its own batch.
	calls chan *call
}

// call is one script call waiting for a pipeline.
type call struct {
	sc   *redis.Script
	args []any
	cmd  *redis.Cmd
	done chan struct{}
}

// Pipeline sends concurrent script calls together until ctx ends: each
// sender takes every call waiting and makes one round trip of them, so
// with many leases in flight Redis and the broker make two system calls
// per batch instead of per call (on a loaded machine, a fifth of the
// CPU a lease costs). A lone call goes at once, as before. Every script
// is idempotent, so go-redis retrying a whole pipeline is safe.
func (s *Store) Pipeline(ctx context.Context, senders int) {
	s.calls = make(chan *call)
	for range senders {
		go s.send(ctx)
	}
}

// maxBatch bounds one round trip.
const maxBatch = 64

func (s *Store) send(ctx context.Context) {
	batch := make([]*call, 0, maxBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-s.calls:
			batch = append(batch[:0], c)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case c := <-s.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		s.exec(context.WithoutCancel(ctx), batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

// readOnly are the scripts whose effects need not reach a replica: a
// lost drain is applied again from the replica's own due set.
func readOnly(sc *redis.Script) bool {
	return sc == getScript || sc == loadsScript || sc == inspectScript
}

// exec makes one round trip of a batch of script calls, setting each
// call's cmd. A script the server has not seen (a new, restarted or
// promoted Redis) is loaded and its calls sent again. With Wait, the
// batch ends with one WAIT that covers every write in it (WAIT counts
// the writes made on its own connection, so it goes down the same
// pipeline, to the node that owns the keys).
func (s *Store) exec(ctx context.Context, batch []*call) {
	wait := false
	for _, c := range batch {
		wait = wait || (s.Wait.Replicas > 0 && !readOnly(c.sc))
	}
	var node redis.Cmdable = s.rdb
	cluster, isCluster := s.rdb.(*redis.ClusterClient)
	if wait && isCluster {
		m, err := cluster.MasterForKey(ctx, s.route[0])
		if err != nil {
			for _, c := range batch {
				c.cmd = failed(ctx, err)
			}
			return
		}
		node = m
	}
	pending := batch
	for try := 0; try < 2 && len(pending) > 0; try++ {
		var acked *redis.Cmd
		sends := merge(pending)
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, m := range sends {
				m.cmd = m.sc.EvalSha(ctx, p, s.route, m.args...)
			}
			if wait {
				acked = p.Do(ctx, "WAIT", s.Wait.Replicas, s.Wait.Timeout.Milliseconds())
			}
			return nil
		})
		if err != nil && wait && isCluster {
			// Talking to the node directly bypasses the Cluster client's
			// own reaction to a dead node or a moved slot: have it relearn
			// the slots, so the next call finds the new owner.
			cluster.ReloadState(ctx)
		}
		for _, m := range sends {
			m.split(ctx)
		}
		var missing []*call
		for _, c := range pending {
			switch {
			case redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT"):
				missing = append(missing, c)
			case wait && c.cmd.Err() == nil && !readOnly(c.sc):
				s.checkAcked(ctx, c, acked)
			}
		}
		pending = nil // not pending[:0]: on the first try it is the caller's batch
		for _, c := range missing {
			// A script that does not load (a Lua error) fails its calls
			// with the reason, not with the resent call's NOSCRIPT.
			if err := c.sc.Load(ctx, node).Err(); err != nil {
				c.cmd = failed(ctx, err)
				continue
			}
			pending = append(pending, c)
		}
	}
}

// sent is one script call on the wire: a call alone, or the calls of a
// batched script merged into one.
type sent struct {
	sc    *redis.Script
	args  []any
	calls []*call
	cmd   *redis.Cmd
}

// merge turns a batch's calls into script calls, one per batched script.
func merge(calls []*call) []*sent {
	out := make([]*sent, 0, len(calls))
	merged := map[*redis.Script]*sent{}
	for _, c := range calls {
		if _, ok := arity[c.sc]; !ok {
			out = append(out, &sent{sc: c.sc, args: c.args, calls: []*call{c}})
			continue
		}
		if m := merged[c.sc]; m != nil {
			m.args = append(m.args, c.args...)
			m.calls = append(m.calls, c)
			continue
		}
		m := &sent{sc: c.sc, args: append([]any(nil), c.args...), calls: []*call{c}}
		merged[c.sc] = m
		out = append(out, m)
	}
	return out
}

// split gives each call its reply: a merged call's list is one reply
// per call, and its error (NOSCRIPT among them) is every call's.
func (m *sent) split(ctx context.Context) {
	if _, ok := arity[m.sc]; !ok {
		m.calls[0].cmd = m.cmd
		return
	}
	replies, err := m.cmd.Slice()
	if err == nil && len(replies) != len(m.calls) {
		err = fmt.Errorf("a batched script answered %d replies to %d calls", len(replies), len(m.calls))
	}
	for i, c := range m.calls {
		c.cmd = redis.NewCmd(ctx)
		if err != nil {
			c.cmd.SetErr(err)
		} else {
			c.cmd.SetVal(replies[i])
		}
	}
}

// checkAcked fails a write fewer replicas than Wait.Replicas acknowledged:
// Redis applied it, but it may not outlive a failover, so say so rather
// than answer as if it were safe. Every write is idempotent (lease id,
// request id), so the caller's retry is harmless.
func (s *Store) checkAcked(ctx context.Context, c *call, acked *redis.Cmd) {
	n, err := acked.Int64()
	if err == nil && n >= int64(s.Wait.Replicas) {
		return
	}
	waitShortfalls.Inc()
	c.cmd = failed(ctx, fmt.Errorf("%d of %d replicas acknowledged the change within %s (%v); retry with the same requestId", n, s.Wait.Replicas, s.Wait.Timeout, err))
}

// New returns a Store on rdb with every key under prefix, which must hold
// a hash tag ("{...}") so each script's keys share one Cluster slot.
func New(rdb redis.UniversalClient, prefix string) *Store {
	return &Store{rdb: rdb, prefix: prefix, route: []string{prefix + KeyDue.Pattern}, tracer: otel.Tracer("egress-proxies/broker/store")}
}

// Ping checks Redis, for readiness.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// Lease is a granted lease.
type Lease struct {
	ID string
	// Proxy is the leased Proxy's UID.
	Proxy   string
	Target  string
	Expires time.Time
	// Addr is the proxy's ip:port when the lease was granted, and Owner
	// the tenant holding it (set by Get).
	Addr, Owner string
	// Load is the proxy's live lease count including this lease (set by
	// Acquire only).
	Load int
	// SessionMoved: the lease's session held another proxy, which no
	// longer qualified (set by Acquire only).
	SessionMoved bool
}

func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// NewLeaseID returns 128 random bits as 32 hex characters.
func NewLeaseID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func wrap(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	switch {
	case redis.HasErrorPrefix(err, "EPOWNER"):
		return ErrNotOwner
	case redis.HasErrorPrefix(err, "EPTARGET"):
		return &WrongTargetError{Leased: strings.TrimPrefix(err.Error(), "EPTARGET ")}
	case redis.HasErrorPrefix(err, "OOM"):
		return fmt.Errorf("%w (%v)", ErrFull, err)
	}
	return &UnavailableError{err}
}

func (s *Store) run(ctx context.Context, sc *redis.Script, args ...any) *redis.Cmd {
	c := &call{sc: sc, args: args, done: make(chan struct{})}
	if s.calls == nil {
		s.exec(ctx, []*call{c})
		return c.cmd
	}
	select {
	case s.calls <- c:
	case <-ctx.Done():
		return failed(ctx, ctx.Err())
	}
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		return failed(ctx, ctx.Err())
	}
}

func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

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

// ErrPastUntil: a renewal's until had passed, by Redis's clock.
var ErrPastUntil = errors.New("the lease may not be renewed past its proxy's deadline, which has passed")

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

// ErrNotOwner: the lease is another tenant's.
var ErrNotOwner = errors.New("the lease is another tenant's")

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

// Member is a proxy as the indexes know it.
type Member struct {
	UID, Namespace, Addr string
	// EgressIP, when known, files the proxy's cooldowns under its exit IP,
	// shared with every proxy on it and inherited by the next one.
	EgressIP string
	// HealthySince is when the proxy last turned healthy (zero: it is
	// not healthy); a later time than a quarantine's start ends it.
	HealthySince time.Time
}

// CooldownKey is what the member's cooldowns are filed under.
func (m Member) CooldownKey() string {
	if m.EgressIP != "" {
		return "ip:" + m.EgressIP
	}
	return "p:" + m.UID
}

// Join adds members to indexes at their current loads and cooldowns.
// With def set it first registers the one index named (def is its
// definition, for other brokers to read back); otherwise indexes that are
// not registered are skipped.
func (s *Store) Join(ctx context.Context, def string, members []Member, indexes []string) error {
	for lo := 0; lo < len(members); lo += batch {
		chunk := members[lo:min(lo+batch, len(members))]
		args := make([]any, 0, 2+5*len(chunk)+len(indexes))
		args = append(args, def, len(chunk))
		for _, m := range chunk {
			var since int64
			if !m.HealthySince.IsZero() {
				since = m.HealthySince.UnixMilli()
			}
			args = append(args, m.UID, m.Namespace, m.Addr, m.CooldownKey(), since)
		}
		for _, h := range indexes {
			args = append(args, h)
		}
		if err := s.run(ctx, joinScript, args...).Err(); err != nil {
			return wrap(err)
		}
	}
	if len(members) == 0 && def != "" {
		return wrap(s.run(ctx, joinScript, def, 0, indexes[0]).Err())
	}
	return nil
}

// Leave takes a proxy out of indexes (all of them when none are named).
func (s *Store) Leave(ctx context.Context, uid string, indexes ...string) error {
	return s.leave(ctx, uid, "0", indexes)
}

// Forget ends a proxy's leases, takes it out of every index and drops its
// load, cooldowns and number: its Proxy is gone. Its exit IP's cooldown
// record stays, for a proxy that lands on the same IP.
func (s *Store) Forget(ctx context.Context, uid string) error { return s.leave(ctx, uid, "1", nil) }

func (s *Store) leave(ctx context.Context, uid, forget string, indexes []string) error {
	args := make([]any, 0, 2+len(indexes))
	args = append(args, uid, forget)
	for _, h := range indexes {
		args = append(args, h)
	}
	return wrap(s.run(ctx, leaveScript, args...).Err())
}

// Drop removes an index.
func (s *Store) Drop(ctx context.Context, index string) error {
	return wrap(s.run(ctx, dropScript, index).Err())
}

// Index is a registered selector index.
type Index struct {
	Def      string
	LastUsed time.Time
}

// Indexes returns every registered index.
func (s *Store) Indexes(ctx context.Context) (map[string]Index, error) {
	defs, err := s.rdb.HGetAll(ctx, s.key(KeyIndexes)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	used, err := s.rdb.ZRangeWithScores(ctx, s.key(KeyIndexUse), 0, -1).Result()
	if err != nil {
		return nil, wrap(err)
	}
	out := make(map[string]Index, len(defs))
	for h, d := range defs {
		out[h] = Index{Def: d}
	}
	for _, z := range used {
		if ix, ok := out[z.Member.(string)]; ok {
			ix.LastUsed = time.UnixMilli(int64(z.Score))
			out[z.Member.(string)] = ix
		}
	}
	return out, nil
}

// Touch records when indexes were last used, so idle ones can be dropped.
func (s *Store) Touch(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	zs := make([]redis.Z, 0, len(used))
	for h, t := range used {
		zs = append(zs, redis.Z{Score: float64(t.UnixMilli()), Member: h})
	}
	return wrap(s.rdb.ZAddXX(ctx, s.key(KeyIndexUse), zs...).Err())
}

// Members returns the proxies an index holds.
func (s *Store) Members(ctx context.Context, index string) ([]string, error) {
	m, err := s.rdb.ZRange(ctx, s.key(KeyIndex, index), 0, -1).Result()
	return m, wrap(err)
}

// Known returns every proxy the store keeps state for, with its namespace.
func (s *Store) Known(ctx context.Context) (map[string]string, error) {
	m, err := s.rdb.HGetAll(ctx, s.key(KeyNamespace)).Result()
	return m, wrap(err)
}

// Refusals are counted per selector index in one hash per minute.
func (s *Store) refusalKey(minute int64) string {
	return s.key(KeyRefused, strconv.FormatInt(minute, 10))
}

// Refused counts one lease refused on index at now.
func (s *Store) Refused(ctx context.Context, index string, now time.Time) error {
	key := s.refusalKey(now.Unix() / 60)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HIncrBy(ctx, key, index, 1)
		p.Expire(ctx, key, refusalKeep)
		return nil
	})
	return wrap(err)
}

// Refusals returns, per index definition, the leases refused in the
// whole minutes that overlap the window ending at now (at most ten).
// Indexes dropped since are left out: nobody leases from them.
func (s *Store) Refusals(ctx context.Context, window time.Duration, now time.Time) (map[string]int64, error) {
	last := now.Unix() / 60
	first := now.Add(-window).Unix() / 60
	first = max(first, last-int64(refusalKeep/time.Minute)+1)
	var minutes []*redis.MapStringStringCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for m := first; m <= last; m++ {
			minutes = append(minutes, p.HGetAll(ctx, s.refusalKey(m)))
		}
		return nil
	}); err != nil {
		return nil, wrap(err)
	}
	counts := map[string]int64{}
	for _, cmd := range minutes {
		for ix, v := range cmd.Val() {
			n, _ := strconv.ParseInt(v, 10, 64)
			counts[ix] += n
		}
	}
	if len(counts) == 0 {
		return counts, nil
	}
	ixs := make([]string, 0, len(counts))
	for ix := range counts {
		ixs = append(ixs, ix)
	}
	defs, err := s.rdb.HMGet(ctx, s.key(KeyIndexes), ixs...).Result()
	if err != nil {
		return nil, wrap(err)
	}
	out := map[string]int64{}
	for i, d := range defs {
		if def, ok := d.(string); ok {
			out[def] += counts[ixs[i]]
		}
	}
	return out, nil
}
