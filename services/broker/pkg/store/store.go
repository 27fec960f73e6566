// Package store keeps every lease, per-proxy load, cooldown and selector
// index in Redis, so any broker replica, or a restarted one, sees the same
// state, and every decision is one atomic script on Redis's clock.
//
// The keys, their types, TTLs and writers are declared in schema.go,
// which the scripts take their key names from.
//
// A call's path: the operations (leases.go, indexes.go, refusals.go,
// report.go, inspect.go, fleet.go) each run one script; scripts.go holds
// the scripts and batches concurrent calls into pipelined round trips;
// errors.go names what a script can refuse.
//
// lib.lua explains how an index answers "least loaded, not cooling, below
// the cap, random among ties" in time independent of the fleet's size.
package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// DefaultPrefix holds every key under one hash tag.
const DefaultPrefix = "{ep}:"

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
