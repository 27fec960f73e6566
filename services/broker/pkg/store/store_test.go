package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
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

// TestTimeIsRedisTime: expiries are Redis's clock plus the TTL, whatever
// the caller's clock says.
func TestTimeIsRedisTime(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(1)...)
	before, err := f.rdb.Time(f.ctx).Result()
	require.NoError(t, err)
	l := f.mustAcquire("ix", "", 0)
	after, err := f.rdb.Time(f.ctx).Result()
	require.NoError(t, err)
	assert.False(t, l.Expires.Before(before.Add(time.Hour).Truncate(time.Millisecond)))
	assert.False(t, l.Expires.After(after.Add(time.Hour)))
}

func TestExpiredLeasesFreeTheirSlots(t *testing.T) {
	f := newFixture(t)
	many := uids(600)
	f.index("many", many[:599]...)
	f.index("one", many[599])
	// 599 short leases on the others, then the one on uid-599 expiring
	// last: more expiries are due than a script applies in passing.
	for range 599 {
		_, err := f.st.Acquire(f.ctx, store.Acquire{Index: "many", Cap: 1, TTL: time.Second, LeaseID: store.NewLeaseID()})
		require.NoError(t, err)
	}
	_, err := f.st.Acquire(f.ctx, store.Acquire{Index: "one", Cap: 1, TTL: time.Second, LeaseID: store.NewLeaseID()})
	require.NoError(t, err)
	_, err = f.acquire("one", "", 1)
	var nc *store.NoCandidateError
	require.ErrorAs(t, err, &nc)
	assert.Equal(t, 1, nc.AtCap)
	time.Sleep(1500 * time.Millisecond)
	l, err := f.acquire("one", "", 1)
	require.NoError(t, err, "the expired lease no longer counts against the cap")
	assert.Equal(t, 1, l.Load)
	loads, err := f.loads(many)
	require.NoError(t, err)
	for _, u := range many[:599] {
		require.Zero(t, loads[u], u)
	}
}

func TestRenew(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(2)...)
	l := f.mustAcquire("ix", "", 0)
	got, err := f.st.Get(f.ctx, l.ID)
	require.NoError(t, err)
	assert.Equal(t, l.Proxy, got.Proxy)
	assert.Regexp(t, `^127\.0\.0\.1:300[01]$`, got.Addr)

	renewed, err := f.st.Renew(f.ctx, got, 2*time.Hour, time.Time{})
	require.NoError(t, err)
	assert.True(t, renewed.Expires.After(l.Expires))

	// A deadline (a draining proxy's) caps the renewal, judged by Redis's
	// clock like every expiry; past it the renewal is refused.
	redisNow, err := f.rdb.Time(f.ctx).Result()
	require.NoError(t, err)
	deadline := redisNow.Add(time.Hour).Truncate(time.Millisecond)
	capped, err := f.st.Renew(f.ctx, got, 2*time.Hour, deadline)
	require.NoError(t, err)
	assert.Equal(t, deadline.UnixMilli(), capped.Expires.UnixMilli())
	_, err = f.st.Renew(f.ctx, got, time.Hour, redisNow.Add(-time.Millisecond))
	require.ErrorIs(t, err, store.ErrPastUntil)

	other := *got
	other.Proxy = "uid-999"
	_, err = f.st.Renew(f.ctx, &other, time.Hour, time.Time{})
	require.ErrorIs(t, err, store.ErrLeaseNotFound, "a lease is renewed only on its own proxy")

	_, err = f.st.Release(f.ctx, l.ID, "")
	require.NoError(t, err)
	_, err = f.st.Renew(f.ctx, got, time.Hour, time.Time{})
	require.ErrorIs(t, err, store.ErrLeaseNotFound)
	_, err = f.st.Get(f.ctx, l.ID)
	require.ErrorIs(t, err, store.ErrLeaseNotFound)
}

// keysNaming lists the keys whose name or hash fields mention s.
func (f *fixture) keysNaming(s string) []string {
	f.t.Helper()
	var out []string
	keys, err := f.rdb.Keys(f.ctx, "*").Result()
	require.NoError(f.t, err)
	for _, k := range keys {
		if strings.Contains(k, s) {
			out = append(out, k)
			continue
		}
		switch f.rdb.Type(f.ctx, k).Val() {
		case "hash":
			if f.rdb.HExists(f.ctx, k, s).Val() {
				out = append(out, k+"["+s+"]")
			}
		case "zset":
			if f.rdb.ZScore(f.ctx, k, s).Err() == nil {
				out = append(out, k+"{"+s+"}")
			}
		case "set":
			if f.rdb.SIsMember(f.ctx, k, s).Val() {
				out = append(out, k+"("+s+")")
			}
		}
	}
	return out
}

func TestForgetDropsEverythingAboutAProxy(t *testing.T) {
	f := newFixture(t)
	f.index("a", uids(2)...)
	f.index("b", uids(2)...)
	mine := f.leaseOn("a", "uid-000")
	_, err := f.cool(mine.ID, "example.com")
	require.NoError(t, err)
	require.NotEmpty(t, f.keysNaming("uid-000"))

	require.NoError(t, f.st.Forget(f.ctx, "uid-000"))
	// Its live lease ends with it (an uninstall leaves no lease key
	// behind): nothing names the proxy, and releasing it is a no-op.
	assert.Empty(t, f.keysNaming("uid-000"))
	assert.Zero(t, f.rdb.Exists(f.ctx, store.DefaultPrefix+"lease:"+mine.ID).Val(), "no lease key")
	due, err := f.rdb.ZRange(f.ctx, store.DefaultPrefix+"due", 0, -1).Result()
	require.NoError(t, err)
	for _, d := range due {
		assert.NotContains(t, d, mine.ID, "no expiry left for the ended lease")
	}
	ok, err := f.st.Release(f.ctx, mine.ID, "")
	require.NoError(t, err)
	assert.False(t, ok, "the lease ended when its proxy was forgotten")
	for range 3 {
		l := f.mustAcquire("b", "example.com", 0)
		assert.Equal(t, "uid-001", l.Proxy)
	}
}

func TestJoinCarriesCooldownsAndDropRemovesAnIndex(t *testing.T) {
	f := newFixture(t)
	f.index("a", uids(2)...)
	l := f.leaseOn("a", "uid-000")
	_, err := f.cool(l.ID, "t")
	require.NoError(t, err)
	// An index built after the cooldown began still skips the proxy.
	f.index("late", uids(2)...)
	for range 4 {
		assert.Equal(t, "uid-001", f.mustAcquire("late", "t", 0).Proxy)
	}
	// Join without a definition does not create an index.
	require.NoError(t, f.st.Join(f.ctx, "", []store.Member{{UID: "uid-000"}}, []string{"nobody"}))
	_, err = f.acquire("nobody", "", 0)
	require.ErrorIs(t, err, store.ErrNoIndex)

	require.NoError(t, f.st.Drop(f.ctx, "late"))
	_, err = f.acquire("late", "t", 0)
	require.ErrorIs(t, err, store.ErrNoIndex)
	assert.Empty(t, f.keysNaming("late"), "no key or membership names the dropped index")
	ix, err := f.st.Indexes(f.ctx)
	require.NoError(t, err)
	assert.Contains(t, ix, "a")
	assert.NotContains(t, ix, "late")
}

// TestCoolingDeepInTheIndex: the proxies that cool down for a target sink
// to the bottom of the index (they get no leases for it). Lease for the
// target past many such levels, and past a level where one member of a
// hundred is free: the answer is still exact.
func TestCoolingDeepInTheIndex(t *testing.T) {
	f := newFixture(t)
	all := uids(130)
	f.index("all", all...)
	leaseOn := func(uid string, n int) *store.Lease {
		f.index("just-"+uid, uid)
		var l *store.Lease
		for range n {
			l = f.mustAcquire("just-"+uid, "", 0)
		}
		return l
	}
	coolOn := func(uid string) {
		l := leaseOn(uid, 1)
		_, err := f.cool(l.ID, "t")
		require.NoError(t, err)
		ok, err := f.st.Release(f.ctx, l.ID, "")
		require.NoError(t, err)
		require.True(t, ok)
	}
	// uid-000..uid-011 carry loads 0..11 and cool down: twelve levels with
	// no free member. uid-012..uid-029 carry load 12 and more.
	for i, u := range all[:30] {
		if i > 0 {
			leaseOn(u, i)
		}
		if i < 12 {
			coolOn(u)
		}
	}
	// The other hundred sit at load 40, all but uid-129 cooling down.
	for i, u := range all[30:] {
		leaseOn(u, 40)
		if i < 99 {
			coolOn(u)
		}
	}
	for range 5 {
		l := f.mustAcquire("all", "t", 0)
		assert.Equal(t, "uid-012", l.Proxy, "the least-loaded proxy not cooling down")
		_, _ = f.st.Release(f.ctx, l.ID, "")
	}
	// With a cap of 13, uid-012 (load 12) is the only one below it.
	l := f.mustAcquire("all", "t", 13)
	assert.Equal(t, "uid-012", l.Proxy)
	_, err := f.acquire("all", "t", 13)
	var nc *store.NoCandidateError
	require.ErrorAs(t, err, &nc)
	assert.Equal(t, store.NoCandidateError{Candidates: 130, CoolingDown: 111, AtCap: 19}, *nc)
	_, _ = f.st.Release(f.ctx, l.ID, "")

	// Only the level at 40 is left free for "t" once 12..29 cool down too:
	// one member in a hundred.
	for _, u := range all[12:30] {
		coolOn(u)
	}
	for range 5 {
		l := f.mustAcquire("all", "t", 0)
		assert.Equal(t, "uid-129", l.Proxy)
		_, _ = f.st.Release(f.ctx, l.ID, "")
	}
}

// The fleet gauges read what the scripts keep: live leases by namespace,
// and cooldowns as what is due that is no lease.
func TestFleetCountsLeasesAndCooldowns(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(3)...)
	fl, err := f.st.Fleet(f.ctx)
	require.NoError(t, err)
	assert.Empty(t, fl.Leases)
	assert.Zero(t, fl.Cooldowns)

	a, b := f.mustAcquire("ix", "", 0), f.mustAcquire("ix", "", 0)
	f.mustAcquire("ix", "", 0)
	_, err = f.cool(a.ID, "x.example")
	require.NoError(t, err)
	_, err = f.cool(b.ID, "y.example")
	require.NoError(t, err)
	fl, err = f.st.Fleet(f.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"ns": 3}, fl.Leases)
	assert.Equal(t, int64(2), fl.Cooldowns)

	_, err = f.st.Release(f.ctx, a.ID, "")
	require.NoError(t, err)
	fl, err = f.st.Fleet(f.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]int64{"ns": 2}, fl.Leases)
	assert.Equal(t, int64(2), fl.Cooldowns, "a released lease's cooldown stays")
}

// report sends one outcome report on lease id.
func (f *fixture) report(id string, o store.Outcome, target string, p store.Policy, faults store.Faults) *store.Verdict {
	f.t.Helper()
	v, err := f.st.Report(f.ctx, store.Report{LeaseID: id, Outcome: o, Target: target, Policy: p, Faults: faults})
	require.NoError(f.t, err)
	return v
}

// Each repeat within the window takes the next level: the base, then a
// period between the last level's and twice it, never past the maximum.
func TestEscalationStaysWithinItsBounds(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(1)...)
	l := f.mustAcquire("ix", "t", 0)
	// Periods long enough that the repeat below lands within them on a
	// loaded machine.
	p := store.Policy{CooldownBase: 500 * time.Millisecond, CooldownMax: time.Second, CooldownWindow: time.Minute, MaxCoolingFraction: 1,
		PacingInitial: 1, PacingMin: 1, PacingMax: 1}
	for level := range 4 {
		v := f.report(l.ID, store.RateLimited, "t", p, store.Faults{})
		assert.Equal(t, level, v.CooldownLevel)
		d := v.CooldownEnd.Sub(v.CooldownStart)
		lo := min(p.CooldownBase<<max(level-1, 0), p.CooldownMax)
		hi := min(p.CooldownBase<<level, p.CooldownMax)
		if level == 0 {
			hi = p.CooldownBase
		}
		assert.GreaterOrEqual(t, d, lo, "level %d", level)
		assert.LessOrEqual(t, d, hi, "level %d", level)
		again := f.report(l.ID, store.RateLimited, "t", p, store.Faults{})
		assert.Equal(t, []string{store.ActionCooldownActive}, again.Actions, "a repeat while cooling changes nothing")
		assert.Equal(t, v.CooldownEnd, again.CooldownEnd)
		time.Sleep(time.Until(v.CooldownEnd) + 20*time.Millisecond)
	}
	v := f.report(l.ID, store.OK, "t", p, store.Faults{})
	assert.Equal(t, []string{store.ActionCooldownDecayed}, v.Actions)
	v = f.report(l.ID, store.RateLimited, "t", p, store.Faults{})
	assert.Equal(t, 3, v.CooldownLevel, "an ok took one level off")
}

// A quarantined proxy leaves its indexes (and cooling indexes) and comes
// back, at its end, to the registered ones it belongs in then: those it
// left, and those a join asked for meanwhile, less those it left since.
func TestQuarantineParksAndRestoresIndexMembership(t *testing.T) {
	f := newFixture(t)
	all := uids(3)
	f.index("a", all...)
	f.index("b", all[1:]...)
	l := f.mustAcquire("a", "t", 1)
	bad := l.Proxy
	_, err := f.cool(l.ID, "t")
	require.NoError(t, err)
	faults := store.Faults{Targets: 2, Window: time.Minute, Period: 300 * time.Millisecond}
	// Errors on two targets, each on a lease of its own (a report counts
	// only for its lease's target).
	x, y := f.leaseOn("a", bad), f.leaseOn("a", bad)
	assert.Empty(t, f.report(x.ID, store.Failed, "x", hourLong, faults).QuarantinedUntil)
	v := f.report(y.ID, store.Failed, "y", hourLong, faults)
	assert.Equal(t, []string{store.ActionQuarantined}, v.Actions)
	st, err := f.st.States(f.ctx, "", "", []string{bad})
	require.NoError(t, err)
	assert.Equal(t, v.QuarantinedUntil, st[bad].QuarantinedUntil)

	members := func(ix string) []string {
		m, err := f.st.Members(f.ctx, ix)
		require.NoError(t, err)
		return m
	}
	assert.NotContains(t, members("a"), bad)
	// Joins while quarantined are remembered, not applied.
	require.NoError(t, f.st.Join(f.ctx, "", []store.Member{{UID: bad, Namespace: "ns", Addr: "127.0.0.1:1"}}, []string{"b"}))
	assert.NotContains(t, members("b"), bad)
	f.index("c", bad)
	require.NoError(t, f.st.Leave(f.ctx, bad, "c"))
	for range 10 {
		l, err := f.acquire("a", "", 0)
		require.NoError(t, err)
		require.NotEqual(t, bad, l.Proxy, "leased while quarantined")
	}

	time.Sleep(time.Until(v.QuarantinedUntil) + 50*time.Millisecond)
	_, _ = f.acquire("b", "", 0) // applies what is due
	assert.Contains(t, members("a"), bad)
	assert.Contains(t, members("b"), bad)
	assert.NotContains(t, members("c"), bad, "it left c while quarantined")
	leased := map[string]bool{}
	for range 30 {
		l, err := f.acquire("a", "", 0)
		require.NoError(t, err)
		leased[l.Proxy] = true
		l, err = f.acquire("a", "t", 0)
		require.NoError(t, err)
		require.NotEqual(t, bad, l.Proxy, "its cooldown for t came back with it")
	}
	assert.True(t, leased[bad], "least-loaded reaches it again once it is back")
	st, err = f.st.States(f.ctx, "", "", []string{bad})
	require.NoError(t, err)
	assert.Zero(t, st[bad].QuarantinedUntil)
}

// Past the guard a target is paced: GCRA grants a second's burst at the
// rate, then says when the next lease is due; the pace lapses after a
// window without reports, in the gauges too.
func TestPacingGrantsItsRateAndLapses(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(2)...)
	p := store.Policy{CooldownBase: time.Hour, CooldownMax: time.Hour, CooldownWindow: 600 * time.Millisecond, MaxCoolingFraction: 0.5,
		PacingInitial: 2, PacingMin: 1, PacingMax: 10}
	a := store.Acquire{Index: "ix", Target: "t", TTL: time.Hour, PerTarget: true}
	lease := func() (*store.Lease, error) {
		a.LeaseID = store.NewLeaseID()
		return f.st.Acquire(f.ctx, a)
	}
	first, err := lease()
	require.NoError(t, err)
	second, err := lease()
	require.NoError(t, err)
	assert.Equal(t, []string{store.ActionCooldownStarted}, f.report(first.ID, store.RateLimited, "t", p, store.Faults{}).Actions)
	v := f.report(second.ID, store.RateLimited, "t", p, store.Faults{})
	require.Equal(t, []string{store.ActionGuardHeld, store.ActionPacingStarted}, v.Actions, "a fleet of two may cool one")
	assert.Equal(t, 2.0, v.PaceRate)
	fleet, err := f.st.Fleet(f.ctx)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"t": 2}, fleet.Paced)

	granted := 0
	var paced *store.PacedError
	for range 10 {
		if _, err = lease(); err != nil {
			require.ErrorAs(t, err, &paced)
			break
		}
		granted++
	}
	assert.Equal(t, 2, granted, "a second's burst at 2/s")
	require.NotNil(t, paced)
	assert.Positive(t, paced.Wait)
	assert.LessOrEqual(t, paced.Wait, 500*time.Millisecond)
	assert.Equal(t, "TARGET_PACED", paced.Reason())
	time.Sleep(paced.Wait + 10*time.Millisecond)
	_, err = lease()
	require.NoError(t, err, "due once the wait is over")

	time.Sleep(700 * time.Millisecond) // the window passes with no report
	fleet, err = f.st.Fleet(f.ctx)
	require.NoError(t, err)
	assert.Empty(t, fleet.Paced, "a lapsed pace is not reported")
	for range 5 {
		_, err = lease()
		require.NoError(t, err, "no longer paced")
	}
}

// A target's cap counts its live leases: released and expired ones free
// their place.
func TestTargetCapCountsLiveLeases(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(3)...)
	a := store.Acquire{Index: "ix", Target: "t", TTL: time.Hour, PerTarget: true, TargetCap: 2}
	lease := func(ttl time.Duration) (*store.Lease, error) {
		a.LeaseID, a.TTL = store.NewLeaseID(), ttl
		return f.st.Acquire(f.ctx, a)
	}
	l1, err := lease(time.Hour)
	require.NoError(t, err)
	_, err = lease(300 * time.Millisecond)
	require.NoError(t, err)
	_, err = lease(time.Hour)
	var capped *store.TargetCapError
	require.ErrorAs(t, err, &capped)
	a.Target = "other"
	_, err = lease(time.Hour)
	require.NoError(t, err, "another target has its own count")
	a.Target = "t"
	ok, err := f.st.Release(f.ctx, l1.ID, "")
	require.NoError(t, err)
	require.True(t, ok)
	_, err = lease(time.Hour)
	require.NoError(t, err, "a release frees a place")
	_, err = lease(time.Hour)
	require.ErrorAs(t, err, &capped)
	time.Sleep(400 * time.Millisecond)
	_, err = lease(time.Hour)
	require.NoError(t, err, "an expiry frees a place")
}
