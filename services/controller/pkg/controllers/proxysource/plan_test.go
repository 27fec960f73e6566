package proxysource

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

func entries(ids ...string) map[string]Entry {
	out := map[string]Entry{}
	for _, id := range ids {
		out[id] = Entry{Host: id, Port: 1}
	}
	return out
}

func TestDecide(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := limits{drainTimeout: time.Minute, markLag: 2 * time.Second, maxShrinkPercent: 50, confirmed: -1}
	drainingSince := func(d time.Duration) time.Time { return now.Add(-d).Add(l.drainTimeout) }
	cases := []struct {
		name    string
		l       limits
		desired map[string]Entry
		members []*member
		want    plan
	}{
		{name: "adds what appeared", desired: entries("a", "b"), members: []*member{{name: "ma", identity: "a"}},
			want: plan{create: []Entry{{Host: "b", Port: 1}}}},
		{name: "drains what left", desired: entries("a", "b", "c"), members: []*member{{name: "ma", identity: "a"}, {name: "mb", identity: "b"}, {name: "mc", identity: "c"}, {name: "md", identity: "d"}},
			want: plan{drain: []string{"md"}, draining: 1}},
		{name: "a failed read changes nothing", desired: nil, members: []*member{{name: "ma", identity: "a"}},
			want: plan{}},
		{name: "a failed read still ends drains", desired: nil, members: []*member{{name: "ma", identity: "a", deadline: drainingSince(time.Minute)}},
			want: plan{delete: []string{"ma"}, draining: 1}},
		{name: "a drain ends when no lease is held after settling", desired: entries(), l: limits{drainTimeout: time.Minute, markLag: 2 * time.Second, maxShrinkPercent: 100, confirmed: -1},
			members: []*member{{name: "ma", identity: "a", deadline: drainingSince(3 * time.Second)}, {name: "mb", identity: "b", deadline: drainingSince(time.Second)}, {name: "mc", identity: "c", deadline: drainingSince(10 * time.Second), leases: 2}},
			want:    plan{delete: []string{"ma"}, draining: 3}},
		{name: "a drain ends at its deadline, leases or not", desired: entries(), members: []*member{{name: "ma", identity: "a", deadline: now, leases: 4}},
			want: plan{delete: []string{"ma"}, draining: 1}},
		{name: "an entry that came back is undrained", desired: entries("a"), members: []*member{{name: "ma", identity: "a", deadline: drainingSince(time.Second), leases: 1}},
			want: plan{undrain: []string{"ma"}}},
		{name: "a deleting member's name is not free", desired: entries("a"), members: []*member{{name: "ma", identity: "a", deleting: true}},
			want: plan{}},
		{name: "half may go at once", desired: entries("a", "b"), members: []*member{{name: "ma", identity: "a"}, {name: "mb", identity: "b"}, {name: "mc", identity: "c"}, {name: "md", identity: "d"}},
			want: plan{drain: []string{"mc", "md"}, draining: 2}},
		{name: "more than half is held", desired: entries("a", "e"), members: []*member{{name: "ma", identity: "a"}, {name: "mb", identity: "b"}, {name: "mc", identity: "c"}, {name: "md", identity: "d"}},
			want: plan{create: []Entry{{Host: "e", Port: 1}}, held: &held{from: 4, to: 2}}},
		{name: "an empty list is held", desired: entries(), members: []*member{{name: "ma", identity: "a"}},
			want: plan{held: &held{from: 1, to: 0}}},
		{name: "confirmed to its size, it goes", l: limits{drainTimeout: time.Minute, markLag: time.Second, maxShrinkPercent: 50, confirmed: 1}, desired: entries("a"),
			members: []*member{{name: "ma", identity: "a"}, {name: "mb", identity: "b"}, {name: "mc", identity: "c"}},
			want:    plan{drain: []string{"mb", "mc"}, draining: 2}},
		{name: "a confirmation of another size holds", l: limits{drainTimeout: time.Minute, markLag: time.Second, maxShrinkPercent: 50, confirmed: 2}, desired: entries("a"),
			members: []*member{{name: "ma", identity: "a"}, {name: "mb", identity: "b"}, {name: "mc", identity: "c"}},
			want:    plan{held: &held{from: 3, to: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lim := l
			if c.l.drainTimeout != 0 {
				lim = c.l
			}
			got := decide(lim, c.desired, c.members, now, now)
			got.whyGone = nil
			assert.Equal(t, c.want, got)
		})
	}
}

// A list of thousands becomes members createsPerSync at a time, in a
// stable order, the rest counted for the next sync.
func TestDecideCreatesABigListOverSeveralSyncs(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := limits{drainTimeout: time.Minute, markLag: time.Second, maxShrinkPercent: 50, confirmed: -1}
	desired := map[string]Entry{}
	for i := range createsPerSync + 7 {
		e := Entry{Host: fmt.Sprintf("h%04d.example", i), Port: 1}
		desired[e.Identity()] = e
	}
	p := decide(l, desired, nil, now, now)
	require.Len(t, p.create, createsPerSync)
	assert.Equal(t, 7, p.pending)
	assert.Equal(t, "h0000.example", p.create[0].Host)

	var members []*member
	for _, e := range p.create {
		members = append(members, &member{name: e.Host, identity: e.Identity()})
	}
	p = decide(l, desired, members, now, now)
	assert.Len(t, p.create, 7, "the next sync creates the rest")
	assert.Zero(t, p.pending)
}

// The source's spec.attributes win over an entry's: a list server cannot
// claim a Tenant's selector key.
func TestSpecAttributesWinOverAnEntrys(t *testing.T) {
	src := &v1.ProxySource{Spec: v1.ProxySourceSpec{Attributes: map[string]string{"team": "a", "geo": "eu"}}}
	got := withAttributes(src, map[string]Entry{"h:1": {Host: "h", Port: 1, Attributes: map[string]string{"team": "b", "tier": "resi"}}})
	assert.Equal(t, map[string]string{"team": "a", "geo": "eu", "tier": "resi"}, got["h:1"].Attributes)
}

func sortedKeys(m map[string]Entry) []string { return slices.Sorted(maps.Keys(m)) }

type meter struct{ bytes, probes int64 }

func (m *meter) ProbeBytes([]types.NamespacedName) (int64, int64) { return m.bytes, m.probes }

// The meter counts what probes spent since its last read into the day's
// figure, starts a new day at midnight UTC, and stretches the interval so
// what is left of the budget lasts the day.
func TestMeterSpreadsTheBudgetOverTheDay(t *testing.T) {
	m := &meter{}
	r := New(nil, nil, nil, nil, nil, Options{Meter: m})
	src := &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "n", UID: "u1"},
		Spec: v1.ProxySourceSpec{ProbeBudget: &v1.ProbeBudget{BytesPerDay: 100 << 20}}}
	members := map[string]*v1.Proxy{}
	for _, n := range []string{"a", "b", "c", "d"} {
		members[n] = &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "n"}}
	}
	noon := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	// Before any probe: the guess of 8 KiB a probe, 4 members, 12 hours
	// left, 100 MiB: 4 × 8 KiB × 43,200 s / 100 MiB ≈ 13.2 s.
	assert.Equal(t, int32(13), r.meter(src, members, noon))
	assert.Equal(t, v1.ProbeSpend{Day: "2026-12-06", SpentBytes: 0, IntervalSeconds: 13}, *src.Status.Probe)
	// 200 probes of 40 KiB: spent, and the interval follows what a probe
	// really costs and what is left.
	m.bytes, m.probes = 200*40<<10, 200
	got := r.meter(src, members, noon.Add(time.Hour))
	assert.Equal(t, int64(200*40<<10), src.Status.Probe.SpentBytes)
	assert.Equal(t, int32(4*40<<10*11*3600/(100<<20-200*40<<10)), got)
	// The budget spent: the longest interval a Proxy takes.
	m.bytes += 100 << 20
	assert.Equal(t, int32(3600), r.meter(src, members, noon.Add(2*time.Hour)))
	// A new day starts from nothing.
	m.bytes += 1000
	r.meter(src, members, noon.Add(13*time.Hour))
	assert.Equal(t, v1.ProbeSpend{Day: "2026-12-07", SpentBytes: 1000, IntervalSeconds: src.Status.Probe.IntervalSeconds}, *src.Status.Probe)
	// Without a budget, no figures and no override.
	src.Spec.ProbeBudget = nil
	assert.Zero(t, r.meter(src, members, noon))
	assert.Nil(t, src.Status.Probe)
}
