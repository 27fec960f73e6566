package store_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

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
