package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// fixture is a Store on its own real redis-server.
type fixture struct {
	t   *testing.T
	rdb *redis.Client
	st  *store.Store
	ctx context.Context
}

func newFixture(t *testing.T) *fixture {
	r := proc.StartRedis(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.DefaultPrefix)
	st.Pipeline(t.Context(), 2)
	return &fixture{t: t, rdb: rdb, st: st, ctx: context.Background()}
}

// index builds index key holding proxies named uid-0..uid-(n-1).
func (f *fixture) index(key string, uids ...string) {
	f.t.Helper()
	ms := make([]store.Member, len(uids))
	for i, u := range uids {
		ms[i] = store.Member{UID: u, Namespace: "ns", Addr: "127.0.0.1:" + fmt.Sprint(3000+i)}
	}
	require.NoError(f.t, f.st.Join(f.ctx, `{"def":"`+key+`"}`, ms, []string{key}))
}

// hourLong cools a proxy down for exactly an hour on a rate_limited
// report, with no guard, escalation or pacing.
var hourLong = store.FixedCooldown(time.Hour)

// cool reports the lease rate_limited for target under hourLong and
// returns the cooldown's end.
func (f *fixture) cool(id, target string) (time.Time, error) {
	v, err := f.st.Report(f.ctx, store.Report{LeaseID: id, Outcome: store.RateLimited, Target: target, Policy: hourLong})
	if err != nil {
		return time.Time{}, err
	}
	return v.CooldownEnd, nil
}

// loads is the live lease count of each proxy.
func (f *fixture) loads(proxies []string) (map[string]int, error) {
	st, err := f.st.States(f.ctx, "", "", proxies)
	out := map[string]int{}
	for p, s := range st {
		out[p] = s.Load
	}
	return out, err
}

func uids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("uid-%03d", i)
	}
	return out
}

func (f *fixture) acquire(key, target string, capacity int) (*store.Lease, error) {
	return f.st.Acquire(f.ctx, store.Acquire{Index: key, Target: target, Cap: capacity, TTL: time.Hour, LeaseID: store.NewLeaseID()})
}

func (f *fixture) mustAcquire(key, target string, capacity int) *store.Lease {
	f.t.Helper()
	l, err := f.acquire(key, target, capacity)
	require.NoError(f.t, err)
	return l
}

// leaseOn acquires from an index of idle, tied proxies until a lease
// lands on uid (ties are drawn at random), leaving the misses held.
func (f *fixture) leaseOn(key, uid string) *store.Lease {
	f.t.Helper()
	for {
		if l := f.mustAcquire(key, "", 0); l.Proxy == uid {
			return l
		}
	}
}

// TestAcquireMatchesAModel drives random acquires, releases and cooldowns
// on two overlapping indexes and checks every answer against a plain
// in-memory model of the rule: the least-loaded proxy not cooling down for
// the target (for everyone, or for the caller by its own untrusted
// reports) and below the cap, or a refusal that counts the cooling and
// the full ones exactly.
func TestAcquireMatchesAModel(t *testing.T) {
	f := newFixture(t)
	all := uids(40)
	var even []string
	for i := 0; i < len(all); i += 2 {
		even = append(even, all[i])
	}
	f.index("all", all...)
	f.index("even", even...)
	members := map[string][]string{"all": all, "even": even}
	load := map[string]int{}
	cooling := map[string]map[string]bool{"a": {}, "b": {}}
	// Two untrusted tenants' own cooldowns, and per proxy and target the
	// last lone reporter ("*" once two agreed); "" is no tenant (trusted).
	callers := []string{"", "ta", "tb"}
	mine := map[string]map[string]map[string]bool{"ta": {"a": {}, "b": {}}, "tb": {"a": {}, "b": {}}}
	claims := map[string]string{}
	owner := map[string]string{}
	leases := map[string]string{}
	bound := map[string]string{} // lease -> the target its reports count for
	var ids []string
	const capacity = 3
	rng := rand.New(rand.NewPCG(1, 2))
	for step := range 3000 {
		switch op := rng.IntN(100); {
		case op < 60:
			key := []string{"all", "even"}[rng.IntN(2)]
			target := []string{"", "a", "b"}[rng.IntN(3)]
			caller := callers[rng.IntN(len(callers))]
			best, cool, full := -1, 0, 0
			var ties []string
			for _, u := range members[key] {
				switch {
				case target != "" && (cooling[target][u] || caller != "" && mine[caller][target][u]):
					cool++
				case load[u] >= capacity:
					full++
				case best == -1 || load[u] < best:
					best, ties = load[u], []string{u}
				case load[u] == best:
					ties = append(ties, u)
				}
			}
			l, err := f.st.Acquire(f.ctx, store.Acquire{Index: key, Target: target, Cap: capacity, TTL: time.Hour, LeaseID: store.NewLeaseID(), Caller: caller})
			if best == -1 {
				var nc *store.NoCandidateError
				require.ErrorAs(t, err, &nc, "step %d", step)
				require.Equal(t, store.NoCandidateError{Candidates: len(members[key]), CoolingDown: cool, AtCap: full}, *nc, "step %d", step)
				continue
			}
			require.NoError(t, err, "step %d", step)
			require.Contains(t, ties, l.Proxy, "step %d: %s has load %d, the least is %d", step, l.Proxy, load[l.Proxy], best)
			load[l.Proxy]++
			require.Equal(t, load[l.Proxy], l.Load, "step %d", step)
			leases[l.ID] = l.Proxy
			owner[l.ID] = caller
			bound[l.ID] = target
			ids = append(ids, l.ID)
		case op < 85 && len(ids) > 0:
			i := rng.IntN(len(ids))
			id := ids[i]
			ids = append(ids[:i], ids[i+1:]...)
			ok, err := f.st.Release(f.ctx, id, owner[id])
			require.NoError(t, err)
			require.True(t, ok)
			load[leases[id]]--
			delete(leases, id)
		case len(ids) > 0:
			id := ids[rng.IntN(len(ids))]
			// A report counts for its lease's target; a lease taken for
			// none is bound to the first a report names.
			target := bound[id]
			if target == "" {
				target = []string{"a", "b"}[rng.IntN(2)]
				bound[id] = target
			}
			by, u := owner[id], leases[id]
			_, err := f.st.Report(f.ctx, store.Report{LeaseID: id, Owner: by, Outcome: store.RateLimited, Target: target, Policy: hourLong})
			require.NoError(t, err)
			switch c := claims[u+"/"+target]; {
			case by == "":
				cooling[target][u] = true
			case c != "" && c != by:
				claims[u+"/"+target] = "*"
				cooling[target][u] = true
			default:
				claims[u+"/"+target] = by
				mine[by][target][u] = true
			}
		}
	}
	loads, err := f.loads(all)
	require.NoError(t, err)
	for _, u := range all {
		assert.Equal(t, load[u], loads[u], u)
	}
}

// TestTiesAreUniform: among equally loaded free proxies each is picked
// equally often, also when cooling proxies sit between them in the index.
func TestTiesAreUniform(t *testing.T) {
	f := newFixture(t)
	all := uids(8)
	f.index("ix", all...)
	for _, u := range []string{"uid-000", "uid-002", "uid-004", "uid-006"} {
		f.coolDown(u, "t")
	}
	const rounds = 4000
	seen := map[string]int{}
	for range rounds {
		l := f.mustAcquire("ix", "t", 0)
		seen[l.Proxy]++
		_, err := f.st.Release(f.ctx, l.ID, "")
		require.NoError(t, err)
	}
	require.Len(t, seen, 4, "only the four free proxies: %v", seen)
	for u, n := range seen {
		// 1,000 expected each; 4.5 standard deviations is ±123.
		assert.InDelta(t, rounds/4, n, 123, "%s picked %d times of %d", u, n, rounds)
	}
}

// coolDown cools uid down for target through a lease on it.
func (f *fixture) coolDown(uid, target string) {
	f.t.Helper()
	for range 100 {
		l := f.mustAcquire("ix", "", 0)
		if l.Proxy == uid {
			_, err := f.cool(l.ID, target)
			require.NoError(f.t, err)
			_, _ = f.st.Release(f.ctx, l.ID, "")
			return
		}
		defer func() { _, _ = f.st.Release(f.ctx, l.ID, "") }()
	}
	f.t.Fatalf("never leased %s", uid)
}

func TestAcquireIsIdempotent(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(4)...)
	t.Run("by lease id", func(t *testing.T) {
		a := store.Acquire{Index: "ix", TTL: time.Hour, LeaseID: store.NewLeaseID()}
		first, err := f.st.Acquire(f.ctx, a)
		require.NoError(t, err)
		again, err := f.st.Acquire(f.ctx, a)
		require.NoError(t, err)
		assert.Equal(t, first.Proxy, again.Proxy)
		assert.Equal(t, 1, again.Load, "the retry took no second slot")
		_, _ = f.st.Release(f.ctx, first.ID, "")
	})
	t.Run("by request id", func(t *testing.T) {
		a := store.Acquire{Index: "ix", TTL: time.Hour, LeaseID: store.NewLeaseID(), RequestID: "req-1", Fingerprint: "fp"}
		first, err := f.st.Acquire(f.ctx, a)
		require.NoError(t, err)
		a.LeaseID = store.NewLeaseID() // a client retry reaches another broker call
		again, err := f.st.Acquire(f.ctx, a)
		require.NoError(t, err)
		assert.Equal(t, first.ID, again.ID)
		assert.Equal(t, 1, again.Load)

		a.Fingerprint, a.LeaseID = "other", store.NewLeaseID()
		_, err = f.st.Acquire(f.ctx, a)
		var reused *store.RequestReusedError
		require.ErrorAs(t, err, &reused)
		assert.Equal(t, first.ID, reused.LeaseID)

		ok, err := f.st.Release(f.ctx, first.ID, "")
		require.NoError(t, err)
		require.True(t, ok)
		a.Fingerprint = "fp"
		fresh, err := f.st.Acquire(f.ctx, a)
		require.NoError(t, err)
		assert.NotEqual(t, first.ID, fresh.ID, "once its lease ended the request id is free")
	})
}

// TestRetryAfterReadTimeoutLeavesNoPhantom reproduces go-redis's retry of
// a script after a read timeout: Redis is stalled (a long script holds
// it), so the call times out on the client while its command waits in the
// socket; go-redis sends it again; Redis then runs every copy. The later
// runs must find the lease the first made, not take more proxies.
func TestRetryAfterReadTimeoutLeavesNoPhantom(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(4)...)
	flaky := redis.NewClient(&redis.Options{Addr: f.rdb.Options().Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: 3,
		MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 2 * time.Millisecond})
	defer func() { _ = flaky.Close() }()
	var dials atomic.Int32
	flaky.AddHook(dialCounter{&dials})
	st := store.New(flaky, store.DefaultPrefix)
	st.Pipeline(t.Context(), 1)
	var l *store.Lease
	// A busy machine can start the stall late, missing the call: then no
	// retry happened, so hand the lease back and stall again.
	for try := 0; dials.Load() == 0 && try < 5; try++ {
		if l != nil {
			_, _ = f.st.Release(f.ctx, l.ID, "")
		}
		_, err := st.Acquire(f.ctx, store.Acquire{Index: "none", LeaseID: store.NewLeaseID()}) // connected, script loaded
		require.ErrorIs(t, err, store.ErrNoIndex)
		dials.Store(0)
		stalled := make(chan error, 1)
		go func() {
			// 300 ms: the first try times out at 200, and the retry's
			// connection is answered once Redis resumes.
			stalled <- f.rdb.Eval(f.ctx, `local t = redis.call('TIME')
local stop = tonumber(t[1]) * 1e6 + tonumber(t[2]) + 300000
repeat t = redis.call('TIME') until tonumber(t[1]) * 1e6 + tonumber(t[2]) > stop
return 1`, nil).Err()
		}()
		time.Sleep(50 * time.Millisecond)
		l, err = st.Acquire(f.ctx, store.Acquire{Index: "ix", TTL: time.Hour, LeaseID: store.NewLeaseID()})
		require.NoError(t, err, "the retry outlasts the stall")
		require.NoError(t, <-stalled)
	}
	require.Positive(t, dials.Load(), "go-redis retried on a new connection")
	loads, err := f.loads(uids(4))
	require.NoError(t, err)
	total := 0
	for _, n := range loads {
		total += n
	}
	assert.Equal(t, 1, total, "one lease in Redis, the one the caller got (%s): %v", l.Proxy, loads)
	assert.Equal(t, 1, loads[l.Proxy])
}

// dialCounter counts connections: go-redis retries a timed-out command on
// a new one.
type dialCounter struct{ n *atomic.Int32 }

func (h dialCounter) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		h.n.Add(1)
		return next(ctx, network, addr)
	}
}

func (dialCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
