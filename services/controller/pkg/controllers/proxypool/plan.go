package proxypool

import (
	"cmp"
	"fmt"
	"slices"
	"time"
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
	// settle is how long after a drain began a lease snapshot must be
	// taken to be trusted: brokers stop leasing a draining member only once
	// they have seen its annotation.
	settle time.Duration
	// drainTimeout is how long a drain may last; its start is the
	// deadline minus this.
	drainTimeout time.Duration
}

// decision is one member's fate and why.
type decision struct {
	m   *member
	why string
}

// plan is what one reconcile does.
type plan struct {
	create int
	// createWhy explains the creations, for their Events.
	createWhy string
	drain     []decision
	delete    []decision
	// blocked names the members that should go (outdated, or above
	// replicas) but are annotated do-not-disrupt.
	blocked []string
}

// leaseView is the lease knowledge a plan rests on.
type leaseView struct {
	at    time.Time // zero: no answer from the broker yet
	known bool
}

// decide derives the plan from the members as observed. It is a pure
// function of its inputs, so a controller restarted at any point decides
// the same again from the same world; the caller makes creations
// idempotent.
//
// The order is the one disruption path: finished drains are deleted;
// then members to take out are drained (outdated first, then unleased,
// then unhealthy, then newest), never a do-not-disrupt one, within the
// disruption budget and never dropping healthy members below replicas
// minus maxUnavailable; then members are created up to replicas (plus
// maxSurge while outdated members wait for replacements).
func decide(l limits, ms []*member, leases leaseView, now time.Time) plan {
	var p plan
	var active []*member
	draining := 0
	for _, m := range ms {
		switch {
		case m.draining():
			draining++
			if why, done := drained(l, m, leases, now); done {
				p.delete = append(p.delete, decision{m, why})
			}
		case m.active():
			active = append(active, m)
		}
	}

	healthy, stuck, updated := 0, 0, 0
	for _, m := range active {
		if m.healthy {
			healthy++
		}
		switch {
		case m.updated:
			updated++
		case m.doNotDisrupt:
			stuck++
		}
	}
	// Outdated members that may not go stand in for members of the
	// current template; every other outdated member is replaced.
	target := l.replicas - stuck
	budget := l.budget - draining
	floor := l.replicas - l.unavailable
	slices.SortFunc(active, drainOrder)
	kept := active[:0:0]
	for _, m := range active {
		why := "its template is outdated"
		if m.updated {
			if updated <= target {
				kept = append(kept, m)
				continue
			}
			why = "the pool is scaled down"
		}
		// Waiting on the budget or on replacements becoming healthy is
		// progress; only a member that may never go blocks the pool.
		switch {
		case m.doNotDisrupt:
			p.blocked = appendOnce(p.blocked, m.name)
		case budget > 0 && (!m.healthy || healthy-1 >= floor):
			p.drain = append(p.drain, decision{m, why})
			budget--
			if m.healthy {
				healthy--
			}
			if m.updated {
				updated--
			}
			continue
		}
		kept = append(kept, m)
	}

	want := target - updated
	room := l.replicas + l.surge - len(kept)
	p.create = max(l.replicas-len(kept), min(want, room), 0)
	switch {
	case p.create == 0:
	case len(kept) < l.replicas:
		p.createWhy = fmt.Sprintf("the pool has %d of %d members", len(kept), l.replicas)
	default:
		p.createWhy = fmt.Sprintf("%d members are made from an outdated template", len(kept)-updated-stuck)
	}
	return p
}

// drained says whether a draining member may be deleted now, and why.
func drained(l limits, m *member, leases leaseView, now time.Time) (string, bool) {
	if !now.Before(m.deadline) {
		if m.leases > 0 {
			return fmt.Sprintf("its drain timed out with %d live leases", m.leases), true
		}
		return "its drain timed out", true
	}
	started := m.deadline.Add(-l.drainTimeout)
	if leases.known && m.leases == 0 && !leases.at.Before(started.Add(l.settle)) {
		return "it holds no live lease", true
	}
	return "", false
}

// drainOrder puts first the members a pool takes out first: outdated,
// then unleased, then unhealthy, then the newest; the highest ordinal
// breaks ties, so the choice is the same on every controller.
func drainOrder(a, b *member) int {
	if c := cmpBool(a.updated, b.updated); c != 0 {
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
