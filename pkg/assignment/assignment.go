// Package assignment is the one place that knows which prober probes a
// proxy, and how a prober's set of targets travels over the probe stream:
// the controller splits a change into messages that each stay far below
// gRPC's default 4 MiB receive limit, and the prober assembles a full
// assignment from its chunks before it replaces its set. A fleet of any
// size therefore reaches a prober that runs with gRPC's defaults.
package assignment

import (
	"hash/fnv"

	"google.golang.org/protobuf/proto"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
)

// Owner is the prober, of probers, that probes target: the one with the
// highest rendezvous hash. Adding or removing a prober moves only the
// targets it wins or held; every other target stays where it is. The
// controller assigns by it, and anyone holding the list of prober ids can
// tell from it which prober has a proxy.
func Owner(probers []string, target string) string {
	var best string
	var bestScore uint64
	for _, p := range probers {
		f := fnv.New64a()
		_, _ = f.Write([]byte(p))
		_, _ = f.Write([]byte{0})
		_, _ = f.Write([]byte(target))
		if s := mix(f.Sum64()); best == "" || s > bestScore {
			best, bestScore = p, s
		}
	}
	return best
}

// mix is murmur3's 64-bit finalizer. FNV-1a alone leaves the high bits
// ruled by the first bytes (the prober id), so one prober would win almost
// every target; mixing spreads every input bit over the whole word.
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// MaxMessageBytes bounds one Assignment: a quarter of gRPC's default
// receive limit, so a message never nears it even with framing overhead.
// At the longest URL the CRD admits (2,048 bytes) that is about 400
// targets a message; at typical URLs, about 10,000.
const MaxMessageBytes = 1 << 20

// perElement is the tag and length prefix of one repeated element, at most.
const perElement = 6

// Split returns the messages that carry one change to a prober's set. With
// full, upsert is the whole set and remove is ignored: the first message
// has full=true and every message but the last has more=true, so the
// prober replaces its set once, from all of them. Without full, each
// message is a delta of its own. A full change always yields at least one
// message (an empty set is a valid assignment); an empty delta yields none.
func Split(full bool, upsert []*probev1.ProbeTarget, remove []string, maxBytes int) []*probev1.Assignment {
	if maxBytes <= 0 {
		maxBytes = MaxMessageBytes
	}
	if full {
		remove = nil
	}
	var out []*probev1.Assignment
	cur, size := &probev1.Assignment{Full: full}, 0
	flush := func() {
		out = append(out, cur)
		cur, size = &probev1.Assignment{}, 0
	}
	for _, t := range upsert {
		n := proto.Size(t) + perElement
		if size > 0 && size+n > maxBytes {
			flush()
		}
		cur.Upsert = append(cur.Upsert, t)
		size += n
	}
	for _, id := range remove {
		n := len(id) + perElement
		if size > 0 && size+n > maxBytes {
			flush()
		}
		cur.Remove = append(cur.Remove, id)
		size += n
	}
	if size > 0 || (full && len(out) == 0) {
		flush()
	}
	if full {
		for _, m := range out[:len(out)-1] {
			m.More = true
		}
	}
	return out
}

// Assembler is the prober's half: it holds the chunks of a full
// assignment until the last one arrives. The zero value is ready to use;
// one Assembler serves one stream.
type Assembler struct {
	open   bool
	staged map[string]*probev1.ProbeTarget
	order  []string
}

// Add takes the next message of the stream and returns the change to
// apply now, or nil while a full assignment is still arriving. A full
// assignment comes back as one message holding every target; a delta comes
// back as it was sent. A message that arrives while a full assignment is
// open continues it, whatever its flags, because the controller sends a
// run without interleaving; a new full=true restarts the run.
func (a *Assembler) Add(m *probev1.Assignment) *probev1.Assignment {
	if !m.GetFull() && !a.open {
		return m
	}
	if m.GetFull() {
		a.open, a.staged, a.order = true, map[string]*probev1.ProbeTarget{}, nil
	}
	for _, t := range m.GetUpsert() {
		if _, ok := a.staged[t.GetId()]; !ok {
			a.order = append(a.order, t.GetId())
		}
		a.staged[t.GetId()] = t
	}
	for _, id := range m.GetRemove() {
		delete(a.staged, id)
	}
	if m.GetMore() {
		return nil
	}
	whole := &probev1.Assignment{Full: true, Upsert: make([]*probev1.ProbeTarget, 0, len(a.staged))}
	for _, id := range a.order {
		if t, ok := a.staged[id]; ok {
			whole.Upsert = append(whole.Upsert, t)
		}
	}
	a.open, a.staged, a.order = false, nil, nil
	return whole
}

// Open reports whether a full assignment is partly received.
func (a *Assembler) Open() bool { return a.open }
