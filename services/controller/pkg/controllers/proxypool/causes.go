package proxypool

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// causes finds why each active member must be replaced, in this order:
// a failure remediation may act on (not Ready in time, unhealthy too
// long, an egress IP another member has), an outdated template,
// rolloutAfter, maxAge.
// It records in c what holds remediation back and when a deadline falls,
// and returns each member's cause (action unset) by name.
func causes(l limits, active []*member, now time.Time, c *plan) map[string]verdict {
	due := func(at time.Time) {
		if d := at.Sub(now); d > 0 && (c.wake == 0 || d < c.wake) {
			c.wake = d
		}
	}
	type failure struct {
		m        *member
		why      string
		detected time.Time
		unwell   bool
	}
	out := make(map[string]verdict, len(active))
	var failures []failure
	shared := sharedEgressIPs(l, active)
	for _, m := range active {
		switch {
		case !m.ready && l.startupTimeout > 0:
			at := m.created.Add(l.startupTimeout)
			if now.Before(at) {
				due(at)
				break
			}
			failures = append(failures, failure{m, fmt.Sprintf("it was not Ready %s after its creation", l.startupTimeout), at, true})
		case m.ready && !m.healthy && l.unhealthyTimeout > 0:
			at := m.since.Add(l.unhealthyTimeout)
			if now.Before(at) {
				due(at)
				break
			}
			failures = append(failures, failure{m, fmt.Sprintf("it has been unhealthy for more than %s", l.unhealthyTimeout), at, true})
		case shared[m.name] != "":
			failures = append(failures, failure{m, shared[m.name], m.since, false})
		}
		if m.healthy && m.retries > 0 && l.unhealthyTimeout > 0 && !now.Before(m.since.Add(l.unhealthyTimeout)) {
			c.recovered = append(c.recovered, m.name)
		}
	}
	// A global fault (the health-check target down, the network out)
	// makes members unhealthy a probe or two apart, so they come due
	// apart too: the short-circuit counts every Ready member unhealthy
	// now, and every member past its startup, once one is due.
	ripe, unwell := 0, 0
	for _, f := range failures {
		if f.unwell {
			ripe++
		}
	}
	for _, m := range active {
		if (m.ready && !m.healthy) || (!m.ready && l.startupTimeout > 0 && !now.Before(m.created.Add(l.startupTimeout))) {
			unwell++
		}
	}
	if ripe > 0 && unwell > l.maxUnhealthy {
		c.paused = fmt.Sprintf("%d of %d members are unhealthy, more than maxUnhealthy (%d): the fault is probably not theirs (the health-check target, the network), so none is replaced", unwell, len(active), l.maxUnhealthy)
	}
	for _, f := range failures {
		switch {
		case f.unwell && c.paused != "":
		case f.m.retries >= l.maxRetries:
			c.exhausted = append(c.exhausted, fmt.Sprintf("%s: %s, and its slot was replaced %d times already", f.m.name, f.why, f.m.retries))
		case now.Before(f.detected.Add(l.backoff(f.m.retries))):
			due(f.detected.Add(l.backoff(f.m.retries)))
		default:
			out[f.m.name] = verdict{cause: CauseFailed, why: f.why}
		}
	}
	for _, m := range active {
		switch {
		case out[m.name].cause != "":
		case !m.updated:
			out[m.name] = verdict{cause: CauseOutdated, why: "its template is outdated"}
		case m.created.Before(l.rolloutAfter) && !now.Before(l.rolloutAfter):
			out[m.name] = verdict{cause: CauseRollout, why: "it was made before the pool's rolloutAfter " + l.rolloutAfter.UTC().Format(time.RFC3339)}
		case m.ageLimit > 0 && !now.Before(m.created.Add(m.ageLimit)):
			out[m.name] = verdict{cause: CauseMaxAge, why: "it reached the pool's maxAge"}
		}
		if m.created.Before(l.rolloutAfter) && now.Before(l.rolloutAfter) {
			due(l.rolloutAfter)
		}
		if m.ageLimit > 0 && out[m.name].cause == "" {
			due(m.created.Add(m.ageLimit))
		}
	}
	return out
}

// sharedEgressIPs names, for each member whose egress IP an older member
// also has, the reason it must go; the oldest of each group stays.
func sharedEgressIPs(l limits, active []*member) map[string]string {
	out := map[string]string{}
	if !l.distinctEgressIPs {
		return out
	}
	byIP := map[string][]*member{}
	for _, m := range active {
		if m.ready && m.egressIP != "" {
			byIP[m.egressIP] = append(byIP[m.egressIP], m)
		}
	}
	for ip, ms := range byIP {
		if len(ms) < 2 {
			continue
		}
		slices.SortFunc(ms, func(a, b *member) int {
			if c := a.created.Compare(b.created); c != 0 {
				return c
			}
			return cmp.Compare(a.name, b.name)
		})
		for _, m := range ms[1:] {
			out[m.name] = fmt.Sprintf("its egress IP %s is %s's too", ip, ms[0].name)
		}
	}
	return out
}
