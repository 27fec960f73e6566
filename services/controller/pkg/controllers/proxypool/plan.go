package proxypool

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// member is what the planner needs of one Proxy of the pool.
type member struct {
	name    string
	created time.Time
	// updated: made from the current template.
	updated bool
	ready   bool
	// healthy: Ready and its probes pass.
	healthy bool
	// since is when the member became healthy (when healthy) or when it
	// stopped being healthy while Ready (when not).
	since    time.Time
	egressIP string
	// ageLimit is the age at which the member is rotated: maxAge less
	// this member's jitter; 0 when the pool has no maxAge.
	ageLimit time.Duration
	// retries counts the failed members this one's slot has been through;
	// replaces names the member it was made to replace.
	retries  int
	replaces string
	// deadline is set while the member drains.
	deadline time.Time
	// deleting: its deletion has begun; it is already gone to the pool.
	deleting     bool
	leases       int32
	doNotDisrupt bool
}

func (m *member) draining() bool { return !m.deadline.IsZero() && !m.deleting }
func (m *member) active() bool   { return m.deadline.IsZero() && !m.deleting }

// limits are a pool's spec, resolved to counts.
type limits struct {
	replicas int
	// surge: members above replicas while replacements come up.
	surge int
	// unavailable: how far healthy members may drop below replicas.
	unavailable int
	// budget: members draining at once, across every cause.
	budget int
	// markLag is how long after a drain began a lease snapshot must be
	// taken to be trusted: brokers stop leasing a draining member only once
	// they have seen its annotation.
	markLag time.Duration
	// drainTimeout is how long a drain may last; its start is the
	// deadline minus this.
	drainTimeout time.Duration

	// Remediation: a member not Ready startupTimeout after its creation,
	// or Ready but unhealthy for unhealthyTimeout, is replaced, unless
	// more than maxUnhealthy members are; a slot is retried maxRetries
	// times, the n-th replacement waiting backoff(n) after the failure.
	startupTimeout, unhealthyTimeout time.Duration
	maxUnhealthy                     int
	maxRetries                       int
	backoffBase, backoffMax          time.Duration
	// distinctEgressIPs: of two members with one egress IP, the newer is
	// replaced (a failure, so retries bound it).
	distinctEgressIPs bool
	// rolloutAfter: once now reaches it, members created before it go.
	rolloutAfter time.Time
}

// backoff is how long after a failure the slot's n-th replacement waits.
func (l limits) backoff(retries int) time.Duration {
	if retries == 0 {
		return 0
	}
	d := l.backoffBase << min(retries-1, 20)
	return min(d, l.backoffMax)
}

// Action is what a reconcile does to a member.
type Action string

const (
	ActionKeep   Action = "keep"
	ActionDrain  Action = "drain"
	ActionDelete Action = "delete"
	ActionCreate Action = "create"
)

// Cause is why a member goes, or why one is created: a closed set, the
// pool metrics' label; the verdict's why says it in words.
type Cause string

const (
	// CauseFailed: not Ready in time, unhealthy too long, or an egress IP
	// another member has (remediation).
	CauseFailed   Cause = "failed"
	CauseOutdated Cause = "outdated"
	CauseMaxAge   Cause = "max-age"
	// CauseRollout: made before the pool's rolloutAfter (a rotation).
	CauseRollout Cause = "rollout-after"
	// CauseScaleDown: a member with no cause of its own, above replicas.
	CauseScaleDown Cause = "scale-down"
	// CauseDrained and CauseDrainTimeout end a drain.
	CauseDrained      Cause = "drained"
	CauseDrainTimeout Cause = "drain-timeout"
	// CauseMissing: a create for a slot no member fills.
	CauseMissing Cause = "missing"
	// CauseReplacement: a create for a member with a cause to go.
	CauseReplacement Cause = "replacement"
)

// verdict is one member's fate in a plan. cause is why it must go
// (empty when it need not); a member kept with a cause waits for the
// budget, the floor of healthy members, or its replacement.
type verdict struct {
	action Action
	cause  Cause
	why    string
}

// creation is one member to create.
type creation struct {
	cause Cause
	why   string
	// replaces names the member this one replaces, retries the count it
	// inherits; both empty for a new slot.
	replaces string
	retries  int
}

// plan is what one reconcile does, decided from what it observed; the
// pool's status is derived from it.
type plan struct {
	// verdicts holds every member not already deleting, by name.
	verdicts map[string]verdict
	// drain and delete name members, in the order they are taken out.
	drain, delete []string
	creates       []creation
	// blocked names the members that should go but are annotated
	// do-not-disrupt.
	blocked []string
	// exhausted says, per member, why its slot was given up: it failed
	// and its slot used all its retries. It stays as it is.
	exhausted []string
	// paused says why remediation is paused; "" when it is not.
	paused string
	// recovered names members healthy for a while whose slot's retry count
	// starts again.
	recovered []string
	// wake is how soon a deadline of a member falls due (0: none).
	wake time.Duration
}

func (c *plan) set(m *member, v verdict) {
	c.verdicts[m.name] = v
	switch v.action {
	case ActionDrain:
		c.drain = append(c.drain, m.name)
	case ActionDelete:
		c.delete = append(c.delete, m.name)
	}
}

// decide derives the plan from the members as observed. It is a pure
// function of its inputs (it changes none of them), so a controller
// restarted at any point decides the same again from the same world; the
// executor makes creations idempotent.
//
// It is the one disruption path: finished drains are deleted; each
// member's cause to go is found (an outdated template, maxAge, a failure
// that remediation may act on); members to take out are drained (those
// with a cause first, then unleased, then unhealthy, then newest), never
// a do-not-disrupt one, within the disruption budget and never dropping
// healthy members below replicas minus maxUnavailable; then members are
// created up to replicas, plus maxSurge while members with a cause wait
// for their replacements.
//
// leasesAt is when the members' lease counts were read (zero: the broker
// has not answered yet, so no drain ends before its deadline).
func decide(l limits, ms []*member, leasesAt time.Time, now time.Time) plan {
	c := plan{verdicts: map[string]verdict{}}
	var active []*member
	draining := 0
	// replaced holds when each member's replacement was made: a later
	// member under a reused name is not replaced by it.
	replaced := map[string]time.Time{}
	for _, m := range ms {
		if m.replaces != "" && !m.deleting && m.created.After(replaced[m.replaces]) {
			replaced[m.replaces] = m.created
		}
		switch {
		case m.draining():
			draining++
			if cause, why, done := drained(l, m, leasesAt, now); done {
				c.set(m, verdict{action: ActionDelete, cause: cause, why: why})
			} else {
				c.verdicts[m.name] = verdict{action: ActionKeep, why: "it drains until its leases end or its deadline"}
			}
		case m.active():
			active = append(active, m)
		}
	}
	cause := causes(l, active, now, &c)

	healthy, stuck, fine := 0, 0, 0
	for _, m := range active {
		if m.healthy {
			healthy++
		}
		switch {
		case cause[m.name].cause == "":
			fine++
		case m.doNotDisrupt:
			stuck++
			c.blocked = append(c.blocked, m.name)
		}
	}
	// Members with a cause that may not go stand in for members of their
	// own; every other one is replaced.
	target := l.replicas - stuck
	budget := l.budget - draining
	floor := l.replicas - l.unavailable
	slices.SortFunc(active, func(a, b *member) int { return drainOrder(cause, a, b) })
	kept := 0
	var replaceable []*member
	for _, m := range active {
		v := cause[m.name]
		if v.cause == "" {
			if fine <= target {
				kept++
				c.verdicts[m.name] = verdict{action: ActionKeep}
				continue
			}
			v.cause, v.why = CauseScaleDown, "the pool is scaled down"
		} else if at, ok := replaced[m.name]; !m.doNotDisrupt && (!ok || at.Before(m.created)) {
			replaceable = append(replaceable, m)
		}
		// Waiting on the budget or on replacements becoming healthy is
		// progress; only a member that may never go blocks the pool.
		switch {
		case m.doNotDisrupt:
			if v.cause == CauseScaleDown {
				c.blocked = appendOnce(c.blocked, m.name)
			}
		case budget > 0 && (!m.healthy || healthy-1 >= floor):
			v.action = ActionDrain
			c.set(m, v)
			budget--
			if m.healthy {
				healthy--
			}
			if v.cause == CauseScaleDown {
				fine--
			}
			continue
		}
		v.action = ActionKeep
		c.verdicts[m.name] = v
		kept++
	}

	want := target - fine
	room := l.replicas + l.surge - kept
	n := max(l.replicas-kept, min(want, room), 0)
	for i := range n {
		if i < len(replaceable) {
			m := replaceable[i]
			v := cause[m.name]
			cr := creation{cause: CauseReplacement, why: fmt.Sprintf("replaces %s: %s", m.name, v.why), replaces: m.name}
			if v.cause == CauseFailed {
				// The member's own failure counts towards its slot's retries.
				cr.retries = m.retries + 1
			}
			c.creates = append(c.creates, cr)
			continue
		}
		c.creates = append(c.creates, creation{cause: CauseMissing, why: fmt.Sprintf("the pool has %d of %d members", kept+i, l.replicas)})
	}
	return c
}

// drained says whether a draining member may be deleted now, and why.
func drained(l limits, m *member, leasesAt time.Time, now time.Time) (Cause, string, bool) {
	timedOut, done := memberset.DrainEnded(m.deadline, l.drainTimeout, l.markLag, int32(m.leases), leasesAt, now)
	switch {
	case timedOut && m.leases > 0:
		return CauseDrainTimeout, fmt.Sprintf("its drain timed out with %d live leases", m.leases), true
	case timedOut:
		return CauseDrainTimeout, "its drain timed out", true
	case done:
		return CauseDrained, "it holds no live lease", true
	}
	return "", "", false
}

// drainOrder puts first the members a pool takes out first: those with
// a cause to go, then unleased, then unhealthy, then the newest; the
// highest ordinal breaks ties, so the choice is the same on every
// controller.
func drainOrder(cause map[string]verdict, a, b *member) int {
	if c := cmpBool(cause[a.name].cause == "", cause[b.name].cause == ""); c != 0 {
		return c
	}
	if c := cmpBool(a.leases > 0, b.leases > 0); c != 0 {
		return c
	}
	if c := cmpBool(a.healthy, b.healthy); c != 0 {
		return c
	}
	if c := b.created.Compare(a.created); c != 0 {
		return c
	}
	// Creation times have a resolution of a second; members named
	// <pool>-<ordinal> made in the same second are newest by ordinal.
	if c := cmp.Compare(len(b.name), len(a.name)); c != 0 {
		return c
	}
	return cmp.Compare(b.name, a.name)
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case !a:
		return -1
	default:
		return 1
	}
}

func appendOnce(s []string, v string) []string {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
