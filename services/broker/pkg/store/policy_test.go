package store_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

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
