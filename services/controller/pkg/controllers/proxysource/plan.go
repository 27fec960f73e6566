package proxysource

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// member is what the planner needs of one Proxy of the source.
type member struct {
	name     string
	identity string
	deleting bool
	// deadline is set while the member drains.
	deadline time.Time
	leases   int32
}

func (m *member) draining() bool { return !m.deadline.IsZero() && !m.deleting }
func (m *member) active() bool   { return m.deadline.IsZero() && !m.deleting }

// limits are the source's spec, resolved.
type limits struct {
	drainTimeout, markLag time.Duration
	maxShrinkPercent      int
	// confirmed is the size annotation confirm-shrink names, -1 if none.
	confirmed int
}

// plan is what one reconcile does: create the entries that appeared,
// take back the drain of members whose entry came back, drain those whose
// entry left, delete those whose drain ended. It decides nothing about
// the members' content, which execute keeps in step with their entries.
type plan struct {
	create []Entry
	// pending counts the creates left for the next sync.
	pending  int
	undrain  []string
	drain    []string
	delete   []string
	whyGone  map[string]string
	held     *held
	draining int
}

// createsPerSync bounds the members one reconcile creates: a list of
// thousands becomes members over several syncs a second apart, each
// short, not one reconcile that holds a worker for minutes.
const createsPerSync = 500

// held is a shrink waiting for confirmation: from members to the
// entries the source now lists.
type held struct{ from, to int }

// decide plans a reconcile: desired is the last good read (nil when the
// source could not be read: then nothing is added or drained), members
// what the cache holds, leasesAt when their lease counts were read.
func decide(l limits, desired map[string]Entry, members []*member, leasesAt, now time.Time) plan {
	p := plan{whyGone: map[string]string{}}
	have := map[string]*member{}
	for _, m := range members {
		if m.deleting {
			have[m.identity] = m // its name is not free until it is gone
			continue
		}
		have[m.identity] = m
		if m.draining() {
			if timedOut, done := memberset.DrainEnded(m.deadline, l.drainTimeout, l.markLag, m.leases, leasesAt, now); done {
				p.delete = append(p.delete, m.name)
				p.whyGone[m.name] = "it left the source and holds no live lease"
				if timedOut {
					p.whyGone[m.name] = fmt.Sprintf("it left the source and its drain timed out with %d live leases", m.leases)
				}
			}
		}
	}
	if desired == nil {
		p.draining = countDraining(members, nil)
		return p
	}
	for id, e := range desired {
		m, ok := have[id]
		switch {
		case !ok:
			p.create = append(p.create, e)
		case m.draining() && !slices.Contains(p.delete, m.name):
			p.undrain = append(p.undrain, m.name)
		}
	}
	var gone []string
	present := 0
	for _, m := range members {
		if !m.active() {
			continue
		}
		present++
		if _, ok := desired[m.identity]; !ok {
			gone = append(gone, m.name)
		}
	}
	if len(gone) > 0 && len(gone)*100 > present*l.maxShrinkPercent && l.confirmed != len(desired) {
		p.held = &held{from: present, to: len(desired)}
		gone = nil
	}
	p.drain = gone
	for _, name := range gone {
		p.whyGone[name] = "it left the source"
	}
	slices.SortFunc(p.create, func(a, b Entry) int { return strings.Compare(a.Identity(), b.Identity()) })
	if len(p.create) > createsPerSync {
		p.pending = len(p.create) - createsPerSync
		p.create = p.create[:createsPerSync]
	}
	slices.Sort(p.drain)
	slices.Sort(p.undrain)
	slices.Sort(p.delete)
	p.draining = countDraining(members, p.undrain) + len(p.drain)
	return p
}

func countDraining(members []*member, undrain []string) int {
	n := 0
	for _, m := range members {
		if m.draining() && !slices.Contains(undrain, m.name) {
			n++
		}
	}
	return n
}
