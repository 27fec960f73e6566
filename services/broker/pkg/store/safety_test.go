package store_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// One token cannot cool a proxy down, or quarantine it, for targets it
// never crawled through it: a report counts only for its lease's target,
// and a lease taken for none is bound to the first a report names.
func TestAReportCountsOnlyForItsLeasesTarget(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(2)...)
	l := f.mustAcquire("ix", "shop.example", 0)
	_, err := f.st.Report(f.ctx, store.Report{LeaseID: l.ID, Outcome: store.RateLimited, Target: "victim.example", Policy: hourLong})
	var wrong *store.WrongTargetError
	require.ErrorAs(t, err, &wrong)
	assert.Equal(t, "shop.example", wrong.Leased)
	assert.Empty(t, f.keysNaming("victim.example"), "a refused report writes nothing")

	open := f.mustAcquire("ix", "", 0)
	f.report(open.ID, store.Failed, "first.example", hourLong, store.Faults{})
	_, err = f.st.Report(f.ctx, store.Report{LeaseID: open.ID, Outcome: store.Failed, Target: "second.example", Policy: hourLong})
	require.ErrorAs(t, err, &wrong, "bound to the first target reported")
	assert.Equal(t, "first.example", wrong.Leased)
	got, err := f.st.Get(f.ctx, open.ID)
	require.NoError(t, err)
	assert.Equal(t, "first.example", got.Target)
}

// Like MachineHealthCheck's maxUnhealthy: past the share of a selector's
// proxies that may be quarantined at once, quarantine holds and leasing
// goes on, however many error reports come in.
func TestQuarantineStopsPastItsShareOfTheFleet(t *testing.T) {
	f := newFixture(t)
	all := uids(10)
	f.index("ix", all...)
	faults := store.Faults{Targets: 2, Window: time.Minute, Period: time.Hour, MaxFraction: 0.3}
	var quarantined, held int
	for _, uid := range all {
		var v *store.Verdict
		for _, target := range []string{"a.example", "b.example"} {
			l := f.leaseOn("ix", uid)
			v = f.report(l.ID, store.Failed, target, hourLong, faults)
		}
		switch {
		case assert.ObjectsAreEqual([]string{store.ActionQuarantined}, v.Actions):
			quarantined++
		case assert.ObjectsAreEqual([]string{store.ActionQuarantineHeld}, v.Actions):
			held++
		default:
			t.Fatalf("%s: actions %v", uid, v.Actions)
		}
	}
	assert.Equal(t, 3, quarantined, "30 %% of 10")
	assert.Equal(t, 7, held)
	members, err := f.st.Members(f.ctx, "ix")
	require.NoError(t, err)
	assert.Len(t, members, 7, "the rest stay leasable")
	_, err = f.acquire("ix", "", 0)
	assert.NoError(t, err)
}

// A named token holds at most its cap of live leases; ending one, by
// release or expiry, frees its place, and other tokens are not counted
// against it.
func TestACallerHoldsAtMostItsCap(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(4)...)
	acquire := func(caller string, ttl time.Duration) (*store.Lease, error) {
		return f.st.Acquire(f.ctx, store.Acquire{Index: "ix", TTL: ttl, LeaseID: store.NewLeaseID(), Caller: caller, CallerCap: 2})
	}
	a1, err := acquire("team-a", time.Hour)
	require.NoError(t, err)
	// Long enough to outlast the calls below on a busy machine.
	short, err := acquire("team-a", 3*time.Second)
	require.NoError(t, err)
	_, err = acquire("team-a", time.Hour)
	var capped *store.CallerCapError
	require.ErrorAs(t, err, &capped)
	assert.Equal(t, store.CallerCapError{Caller: "team-a", Cap: 2, Live: 2}, *capped)
	assert.Contains(t, err.Error(), `tenant "team-a" holds 2 live leases`)
	_, err = acquire("team-b", time.Hour)
	require.NoError(t, err, "another token has its own count")

	_, err = f.st.Release(f.ctx, a1.ID, "team-a")
	require.NoError(t, err)
	_, err = acquire("team-a", time.Hour)
	require.NoError(t, err, "a release frees a place")
	time.Sleep(time.Until(short.Expires) + 200*time.Millisecond)
	_, err = acquire("team-a", time.Hour)
	require.NoError(t, err, "so does an expiry")
	_, err = acquire("team-a", time.Hour)
	require.ErrorAs(t, err, &capped)
}

// A lease is its tenant's: another's release and report are refused and
// change nothing; its owner's work.
func TestALeaseIsItsTenants(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(2)...)
	l, err := f.st.Acquire(f.ctx, store.Acquire{Index: "ix", TTL: time.Hour, LeaseID: store.NewLeaseID(), Caller: "team-a"})
	require.NoError(t, err)
	got, err := f.st.Get(f.ctx, l.ID)
	require.NoError(t, err)
	assert.Equal(t, "team-a", got.Owner)

	released, err := f.st.Release(f.ctx, l.ID, "team-b")
	assert.ErrorIs(t, err, store.ErrNotOwner)
	assert.False(t, released)
	_, err = f.st.Report(f.ctx, store.Report{LeaseID: l.ID, Owner: "team-b", Outcome: store.Blocked, Target: "shop.example", Policy: store.FixedCooldown(time.Hour)})
	assert.ErrorIs(t, err, store.ErrNotOwner)
	st, err := f.st.States(f.ctx, "shop.example", "", []string{l.Proxy})
	require.NoError(t, err)
	assert.Equal(t, 1, st[l.Proxy].Load, "the lease lives on")
	assert.True(t, st[l.Proxy].CooldownUntil.IsZero(), "and another tenant's report cooled nothing")

	_, err = f.st.Report(f.ctx, store.Report{LeaseID: l.ID, Owner: "team-a", Outcome: store.OK, Target: "shop.example", Policy: store.FixedCooldown(time.Hour)})
	require.NoError(t, err)
	released, err = f.st.Release(f.ctx, l.ID, "team-a")
	require.NoError(t, err)
	assert.True(t, released)
}

// A tenant takes at most its leases a minute, across brokers (one count
// in Redis); the refusal says when the next minute starts, and other
// tenants are not counted against it.
func TestACallerTakesAtMostItsLeasesAMinute(t *testing.T) {
	f := newFixture(t)
	f.index("ix", uids(10)...)
	acquire := func(caller string) error {
		_, err := f.st.Acquire(f.ctx, store.Acquire{Index: "ix", TTL: time.Hour, LeaseID: store.NewLeaseID(), Caller: caller, CallerRate: 3})
		return err
	}
	var refused *store.CallerRateError
	for n := 0; ; n++ {
		err := acquire("team-a")
		if errors.As(err, &refused) {
			// A minute may have turned during the loop: at most twice 3.
			assert.GreaterOrEqual(t, n, 3)
			assert.LessOrEqual(t, n, 6)
			break
		}
		require.NoError(t, err)
	}
	assert.Equal(t, "team-a", refused.Caller)
	assert.Positive(t, refused.Wait)
	assert.LessOrEqual(t, refused.Wait, time.Minute)
	assert.Contains(t, refused.Error(), `tenant "team-a" took its 3 leases this minute`)
	require.NoError(t, acquire("team-b"), "another tenant has its own count")
}

// A full Redis (maxmemory, noeviction) refuses a new lease with ErrFull,
// which the API turns into a clear RESOURCE_EXHAUSTED; expiries due meanwhile
// are applied whole later, leases still end by release, and once room is
// made leasing resumes with every count right.
func TestAFullRedisRefusesNewLeasesAndStillEndsThem(t *testing.T) {
	r := proc.StartRedis(t, false, "--maxmemory", "4mb", "--maxmemory-policy", "noeviction")
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.DefaultPrefix)
	f := &fixture{t: t, rdb: rdb, st: st, ctx: t.Context()}
	all := uids(20)
	f.index("ix", all...)
	kept := f.mustAcquire("ix", "", 0)
	for range 5 {
		_, err := st.Acquire(f.ctx, store.Acquire{Index: "ix", TTL: 200 * time.Millisecond, LeaseID: store.NewLeaseID()})
		require.NoError(t, err)
	}
	// Someone else's data fills Redis to its limit.
	blob := strings.Repeat("x", 512)
	var ballast []string
	for i := 0; ; i++ {
		k := fmt.Sprintf("ballast:%d", i)
		if err := rdb.Set(f.ctx, k, blob, 0).Err(); err != nil {
			require.True(t, redis.HasErrorPrefix(err, "OOM"), "%v", err)
			break
		}
		ballast = append(ballast, k)
	}
	time.Sleep(300 * time.Millisecond) // the five are due to expire
	// Redis checks its memory before each command, so a call may still
	// squeeze in at the edge; within a few the store is full.
	granted := 0
	for i := 0; ; i++ {
		require.Less(t, i, 100, "Redis never refused a lease")
		_, err := f.acquire("ix", "", 0)
		if err == nil {
			granted++
			continue
		}
		require.ErrorIs(t, err, store.ErrFull)
		assert.Contains(t, err.Error(), "maxmemory")
		break
	}
	ok, err := st.Release(f.ctx, kept.ID, "")
	require.NoError(t, err, "a release runs on a full Redis")
	assert.True(t, ok)

	for len(ballast) > 0 {
		n := min(len(ballast), 500)
		require.NoError(t, rdb.Del(f.ctx, ballast[:n]...).Err())
		ballast = ballast[n:]
	}
	_, err = f.acquire("ix", "", 0)
	require.NoError(t, err, "room made, leasing resumes")
	loads, err := f.loads(all)
	require.NoError(t, err)
	total := 0
	for _, n := range loads {
		total += n
	}
	assert.Equal(t, granted+1, total, "every expiry applied whole: no load left behind by a lease that is gone")
}

// States applies what is due before it counts (it is how the controller
// sees a drained proxy's last lease end): its script may write, though it
// only reads what callers see.
func TestStatesApplyDueExpiries(t *testing.T) {
	f := newFixture(t)
	all := uids(1)
	f.index("ix", all...)
	l, err := f.st.Acquire(f.ctx, store.Acquire{Index: "ix", TTL: 2 * time.Second, LeaseID: store.NewLeaseID()})
	require.NoError(t, err)
	loads, err := f.loads(all)
	require.NoError(t, err)
	assert.Equal(t, 1, loads[all[0]])
	time.Sleep(time.Until(l.Expires) + 200*time.Millisecond)
	loads, err = f.loads(all)
	require.NoError(t, err, "an expiry due when the counts are read")
	assert.Equal(t, 0, loads[all[0]])
}

// weighing is a fixture whose leases and reports are made as tenants.
type weighing struct {
	*fixture
	p store.Policy
	q store.Faults
}

// lease takes a lease for target as caller, on uid when it is given
// (ties are drawn at random: the misses are released).
func (w *weighing) lease(caller, target, uid string) (*store.Lease, error) {
	for range 200 {
		l, err := w.st.Acquire(w.ctx, store.Acquire{Index: "ix", Target: target, TTL: time.Hour, LeaseID: store.NewLeaseID(), Caller: caller, PerTarget: true})
		if err != nil || uid == "" || l.Proxy == uid {
			return l, err
		}
		_, err = w.st.Release(w.ctx, l.ID, caller)
		require.NoError(w.t, err)
	}
	w.t.Fatalf("%s never leased %s", caller, uid)
	return nil, nil
}

// report leases uid for target as caller and reports o on it.
func (w *weighing) report(caller string, trusted bool, uid, target string, o store.Outcome) []string {
	w.t.Helper()
	l, err := w.lease(caller, target, uid)
	require.NoError(w.t, err)
	v, err := w.st.Report(w.ctx, store.Report{LeaseID: l.ID, Owner: caller, Trusted: trusted, Outcome: o, Target: target, Policy: w.p, Faults: w.q})
	require.NoError(w.t, err)
	_, err = w.st.Release(w.ctx, l.ID, caller)
	require.NoError(w.t, err)
	return v.Actions
}

// cooling is whether uid cools down for target for every tenant.
func (w *weighing) cooling(uid, target string) bool {
	st, err := w.st.States(w.ctx, target, "", []string{uid})
	require.NoError(w.t, err)
	return !st[uid].CooldownUntil.IsZero()
}

// An untrusted tenant's reports cost that tenant: its ban storm cools the
// proxies for itself alone and paces nothing; a second tenant's ban on
// the same exit, or a trusted tenant's, cools it for everyone. Its errors
// quarantine nobody's proxy until another tenant's agree.
func TestReportsWeighPerTenant(t *testing.T) {
	w := &weighing{fixture: newFixture(t),
		p: store.Policy{CooldownBase: time.Hour, CooldownMax: time.Hour, CooldownWindow: time.Hour, MaxCoolingFraction: 0.5, PacingInitial: 2, PacingMin: 1, PacingMax: 10},
		q: store.Faults{Targets: 2, Window: time.Minute, Period: time.Hour}}
	all := uids(4)
	w.index("ix", all...)

	for _, u := range all {
		assert.Equal(t, []string{store.ActionCooldownStarted, store.ActionTenantOnly}, w.report("team-a", false, u, "t", store.Blocked), u)
	}
	_, err := w.lease("team-a", "t", "")
	var none *store.NoCandidateError
	require.ErrorAs(t, err, &none, "every proxy cools down for team-a")
	assert.Equal(t, 4, none.CoolingDown)
	fleet, err := w.st.Fleet(w.ctx)
	require.NoError(t, err)
	assert.Empty(t, fleet.Paced, "a storm of one tenant's reports paces nothing")
	seen := map[string]bool{}
	for range 40 {
		l, err := w.lease("team-b", "t", "")
		require.NoError(t, err, "team-b leases for t as before")
		seen[l.Proxy] = true
		_, err = w.st.Release(w.ctx, l.ID, "team-b")
		require.NoError(t, err)
	}
	assert.Len(t, seen, 4, "from every proxy")
	for _, u := range all {
		assert.False(t, w.cooling(u, "t"), u)
	}

	// A second tenant agrees on uid-000: it cools down for everyone.
	assert.Equal(t, []string{store.ActionCooldownStarted}, w.report("team-b", false, "uid-000", "t", store.Blocked))
	assert.True(t, w.cooling("uid-000", "t"))
	assert.False(t, w.cooling("uid-001", "t"))
	// From then on, within the window, any tenant's ban on that exit and
	// target is the fleet's; a trusted tenant's always is.
	assert.Equal(t, []string{store.ActionCooldownStarted}, w.report("team-c", true, "uid-001", "u", store.Blocked))
	assert.True(t, w.cooling("uid-001", "u"))

	// Errors: team-a's on two targets quarantine nothing; team-b's one
	// more agrees.
	for _, target := range []string{"e1", "e2"} {
		actions := w.report("team-a", false, "uid-002", target, store.Failed)
		assert.Equal(t, []string{store.ActionCooldownStarted, store.ActionTenantOnly}, actions, target)
	}
	l, err := w.lease("team-a", "e1", "")
	require.NoError(t, err)
	assert.NotEqual(t, "uid-002", l.Proxy, "team-a's next lease for e1 goes elsewhere")
	assert.Equal(t, []string{store.ActionCooldownStarted, store.ActionTenantOnly, store.ActionQuarantined}, w.report("team-b", false, "uid-002", "e1", store.Failed))
}

// A tenant's own cooldown that outlasts a fleet-wide one still holds for
// that tenant when the fleet-wide one ends, and for nobody else.
func TestATenantsOwnCooldownOutlastsTheFleets(t *testing.T) {
	w := &weighing{fixture: newFixture(t), p: store.FixedCooldown(time.Hour)}
	w.index("ix", "uid-000")
	w.report("team-a", false, "uid-000", "t", store.RateLimited)
	// Long enough that the checks before its end pass on a busy machine;
	// the sleep after them outlasts it whatever they took.
	w.p = store.FixedCooldown(2 * time.Second)
	assert.Equal(t, []string{store.ActionCooldownStarted}, w.report("ops", true, "uid-000", "t", store.RateLimited))
	var none *store.NoCandidateError
	for _, caller := range []string{"team-a", "team-b"} {
		_, err := w.lease(caller, "t", "")
		require.ErrorAs(t, err, &none, caller)
		assert.Equal(t, 1, none.CoolingDown, caller)
	}
	time.Sleep(2200 * time.Millisecond)
	_, err := w.lease("team-a", "t", "")
	require.ErrorAs(t, err, &none, "team-a's own hour goes on")
	assert.Equal(t, 1, none.CoolingDown)
	_, err = w.lease("team-b", "t", "")
	require.NoError(t, err, "the fleet's ended")
}

// An untrusted tenant's ok reports decay its own record and leave the
// target's pace alone; a trusted one's raise it.
func TestAnUntrustedOKLeavesThePaceAlone(t *testing.T) {
	w := &weighing{fixture: newFixture(t),
		p: store.Policy{CooldownBase: time.Hour, CooldownMax: time.Hour, CooldownWindow: time.Hour, MaxCoolingFraction: 0.5, PacingInitial: 100, PacingMin: 1, PacingMax: 1000}}
	w.index("ix", uids(2)...)
	assert.Equal(t, []string{store.ActionCooldownStarted}, w.report("ops", true, "uid-000", "t", store.RateLimited))
	assert.Equal(t, []string{store.ActionGuardHeld, store.ActionPacingStarted}, w.report("ops", true, "uid-001", "t", store.RateLimited))
	assert.Equal(t, []string{store.ActionNone}, w.report("team-a", false, "uid-001", "t", store.OK))
	assert.Equal(t, []string{store.ActionPaceRaised}, w.report("ops", true, "uid-001", "t", store.OK))
}
