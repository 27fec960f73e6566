// Package store keeps every lease, per-proxy load and cooldown in Redis,
// so any broker replica, or a restarted one, sees the same state.
//
// Keys (one hash tag, so every multi-key script runs in one Cluster slot):
//
//	{ep}:lease:<leaseID>        hash {proxy, target, expires}; expires itself at lease end
//	{ep}:load:<proxyID>         sorted set of leaseIDs scored by expiry (ms)
//	{ep}:cool:<proxyID>:<target> present while the proxy cools down for target
//
// A proxy's load is the number of members of its load set scored after
// now: an expired lease stops counting the moment it expires, without a
// sweeper; the scripts prune expired members as they pass.
package store

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

const prefix = "{ep}:"

func leaseKey(id string) string           { return prefix + "lease:" + id }
func loadKey(proxy string) string         { return prefix + "load:" + proxy }
func coolKey(proxy, target string) string { return prefix + "cool:" + proxy + ":" + target }

var (
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed report.lua
	reportSrc string

	acquireScript = redis.NewScript(acquireSrc)
	renewScript   = redis.NewScript(renewSrc)
	releaseScript = redis.NewScript(releaseSrc)
	reportScript  = redis.NewScript(reportSrc)
)

// Errors the API maps to status codes.
var (
	// ErrLeaseNotFound: unknown or expired lease.
	ErrLeaseNotFound = errors.New("lease not found or expired")
)

// NoCandidateError says why no proxy could be leased.
type NoCandidateError struct {
	Candidates, CoolingDown, AtCap int
	// Stale counts matching proxies left out because their health is
	// stale (no recent probe result); it matters when no candidate is left.
	Stale int
}

func (e *NoCandidateError) Error() string {
	switch {
	case e.Candidates == 0 && e.Stale > 0:
		return fmt.Sprintf("no healthy Ready proxy matches the selector: the health of %d matching proxies is stale (the controller has had no probe result for them lately, so probing has stopped; check the probers)", e.Stale)
	case e.Candidates == 0:
		return "no healthy Ready proxy matches the selector"
	}
	return fmt.Sprintf("all %d matching proxies are unavailable: %d cooling down for the target, %d at the lease cap", e.Candidates, e.CoolingDown, e.AtCap)
}

// Reason is a stable machine-readable reason.
func (e *NoCandidateError) Reason() string {
	switch {
	case e.Candidates == 0 && e.Stale > 0:
		return "HEALTH_STALE"
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

// UnavailableError wraps a Redis failure: nothing was written.
type UnavailableError struct{ Err error }

func (e *UnavailableError) Error() string { return "lease store unavailable: " + e.Err.Error() }
func (e *UnavailableError) Unwrap() error { return e.Err }

// Store is the Redis-backed lease store.
type Store struct {
	rdb    redis.UniversalClient
	now    func() time.Time
	tracer trace.Tracer
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, now: time.Now, tracer: otel.Tracer("egress-proxies/broker/store")}
}

// Ping checks Redis, for readiness.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// Lease is a granted lease.
type Lease struct {
	ID      string
	Proxy   string
	Target  string
	Expires time.Time
	// Load is the proxy's live lease count including this lease (set by
	// Acquire only).
	Load int
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
	return &UnavailableError{err}
}

// Acquire atomically picks the least-loaded of candidates that is not
// cooling down for target and is below cap (0: no cap), ties broken at
// random, and records the lease. With several brokers racing, the script
// runs one at a time in Redis, so no proxy ever passes its cap.
func (s *Store) Acquire(ctx context.Context, candidates []string, target string, ttl time.Duration, cap int) (*Lease, error) {
	ctx, span := s.tracer.Start(ctx, "store.Acquire", trace.WithAttributes(attribute.Int("candidates", len(candidates))))
	defer span.End()
	if len(candidates) == 0 {
		return nil, &NoCandidateError{}
	}
	id := NewLeaseID()
	n := len(candidates)
	keys := make([]string, 0, 2*n+1)
	for _, c := range candidates {
		keys = append(keys, loadKey(c))
	}
	for _, c := range candidates {
		keys = append(keys, coolKey(c, target))
	}
	keys = append(keys, leaseKey(id))
	r, _ := rand.Int(rand.Reader, big.NewInt(1<<30))
	args := make([]any, 0, 7+n)
	args = append(args, n, s.now().UnixMilli(), ttl.Milliseconds(), cap, id, target, r.Int64())
	for _, c := range candidates {
		args = append(args, c)
	}
	res, err := acquireScript.Run(ctx, s.rdb, keys, args...).Int64Slice()
	if err != nil {
		return nil, wrap(err)
	}
	if res[0] == 0 {
		return nil, &NoCandidateError{Candidates: n, CoolingDown: int(res[1]), AtCap: int(res[2])}
	}
	return &Lease{ID: id, Proxy: candidates[res[0]-1], Target: target, Expires: time.UnixMilli(res[3]), Load: int(res[4])}, nil
}

// Get returns a live lease.
func (s *Store) Get(ctx context.Context, id string) (*Lease, error) {
	v, err := s.rdb.HGetAll(ctx, leaseKey(id)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	exp, _ := strconv.ParseInt(v["expires"], 10, 64)
	if v["proxy"] == "" || exp <= s.now().UnixMilli() {
		return nil, ErrLeaseNotFound
	}
	return &Lease{ID: id, Proxy: v["proxy"], Target: v["target"], Expires: time.UnixMilli(exp)}, nil
}

// Renew extends a live lease to now+ttl.
func (s *Store) Renew(ctx context.Context, id string, ttl time.Duration) (*Lease, error) {
	ctx, span := s.tracer.Start(ctx, "store.Renew")
	defer span.End()
	l, err := s.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	res, err := renewScript.Run(ctx, s.rdb, []string{leaseKey(id), loadKey(l.Proxy)}, id, l.Proxy, s.now().UnixMilli(), ttl.Milliseconds()).Int64()
	if err != nil {
		return nil, wrap(err)
	}
	if res == 0 {
		return nil, ErrLeaseNotFound
	}
	l.Expires = time.UnixMilli(res)
	return l, nil
}

// Release ends a lease; releasing an unknown lease is not an error.
// It reports whether a live lease was released.
func (s *Store) Release(ctx context.Context, id string) (bool, error) {
	ctx, span := s.tracer.Start(ctx, "store.Release")
	defer span.End()
	proxy, err := s.rdb.HGet(ctx, leaseKey(id), "proxy").Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, wrap(err)
	}
	n, err := releaseScript.Run(ctx, s.rdb, []string{leaseKey(id), loadKey(proxy)}, id, proxy).Int64()
	if err != nil {
		return false, wrap(err)
	}
	return n == 1, nil
}

// Cooldown puts the lease's proxy in a cooldown for target, if the lease
// is live. It returns the cooldown's end.
func (s *Store) Cooldown(ctx context.Context, id, target string, d time.Duration) (time.Time, error) {
	ctx, span := s.tracer.Start(ctx, "store.Cooldown")
	defer span.End()
	l, err := s.Get(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	now := s.now().UnixMilli()
	n, err := reportScript.Run(ctx, s.rdb, []string{leaseKey(id), coolKey(l.Proxy, target)}, l.Proxy, now, d.Milliseconds()).Int64()
	if err != nil {
		return time.Time{}, wrap(err)
	}
	if n == 0 {
		return time.Time{}, ErrLeaseNotFound
	}
	return time.UnixMilli(now + d.Milliseconds()), nil
}

// Loads returns the live lease count of each proxy.
func (s *Store) Loads(ctx context.Context, proxies []string) (map[string]int, error) {
	if len(proxies) == 0 {
		return map[string]int{}, nil
	}
	now := strconv.FormatInt(s.now().UnixMilli(), 10)
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.IntCmd, len(proxies))
	for i, p := range proxies {
		cmds[i] = pipe.ZCount(ctx, loadKey(p), "("+now, "+inf")
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, wrap(err)
	}
	out := make(map[string]int, len(proxies))
	for i, p := range proxies {
		out[p] = int(cmds[i].Val())
	}
	return out, nil
}
