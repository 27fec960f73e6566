// Package brokertest assembles the broker's pieces on real parts for the
// packages' tests: an inventory watching an envtest API server, a store on
// a real redis-server, and the index maintainer between them.
package brokertest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Stack is one broker's state, without its servers.
type Stack struct {
	Env   *testenv.Env
	NS    string
	Redis *redis.Client
	Store *store.Store
	Index *index.Maintainer
	Inv   *inventory.Inventory
}

// New starts a stack serving a fresh namespace; tune adjusts the
// maintainer before it runs.
func New(t *testing.T, env *testenv.Env, tune func(*index.Maintainer)) *Stack {
	t.Helper()
	testenv.Require(t)
	r := proc.StartRedis(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s := &Stack{Env: env, NS: env.Namespace(t, "broker"), Redis: rdb, Store: store.New(rdb, store.DefaultPrefix)}
	s.Store.Pipeline(t.Context(), 2)
	s.Index = &index.Maintainer{Store: s.Store, Log: slog.New(slog.DiscardHandler), Scope: s.NS,
		Resync: index.DefaultResync, Idle: index.DefaultIdle, MaxIndexes: index.DefaultMaxIndexes}
	if tune != nil {
		tune(s.Index)
	}
	var err error
	s.Inv, err = s.Index.Start(t.Context(), env.Config)
	require.NoError(t, err)
	require.Eventually(t, s.Inv.Synced, 30*time.Second, 10*time.Millisecond)
	return s
}

// Proxy makes a Ready, healthy proxy and waits until the inventory has it.
func (s *Stack) Proxy(t *testing.T, name, ip string, attrs map[string]string) inventory.Proxy {
	t.Helper()
	px := s.Env.ReadyProxy(t, s.NS, name, ip, 3128, attrs, true)
	var p inventory.Proxy
	require.Eventually(t, func() bool {
		var ok bool
		p, ok = s.Inv.Get(string(px.UID))
		return ok && p.Leasable
	}, 30*time.Second, 10*time.Millisecond, "the inventory never saw %s leasable", name)
	return p
}

// Members returns the proxies index key holds in Redis.
func (s *Stack) Members(t *testing.T, key string) []string {
	t.Helper()
	m, err := s.Store.Members(context.Background(), key)
	require.NoError(t, err)
	return m
}
