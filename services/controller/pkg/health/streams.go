package health

import (
	"context"
	"net"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/assignment"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
)

// session is one connected prober. desired, changed and full are guarded
// by Hub.mu; the session's sender alone knows what was sent.
type session struct {
	id     string
	stream probev1.ProbeService_ConnectServer
	// desired is the prober's share.
	desired map[string]*probev1.ProbeTarget
	// changed: ids of desired that changed since the sender last looked.
	changed map[string]struct{}
	// full: the next send replaces the prober's whole set.
	full bool
	wake chan struct{}
}

func (s *session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// trigger asks the rebalancer to run; callers hold mu or not, it never blocks.
func (h *Hub) trigger() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// rebalance moves what changed into the probers' shares: every target
// when the set of probers changed, else only the marked ones, so a fleet of
// 10,000 costs a map lookup per changed proxy and not a pass over all.
func (h *Hub) rebalance() {
	h.mu.Lock()
	defer h.mu.Unlock()
	ids := make([]string, 0, len(h.sessions))
	for id := range h.sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	if h.regroup {
		h.regroup = false
		for tid := range h.targets {
			h.dirty[tid] = struct{}{}
		}
	}
	for tid := range h.dirty {
		t, exists := h.targets[tid]
		next := ""
		if exists && len(ids) > 0 {
			next = assignment.Owner(ids, tid)
		}
		if prev, ok := h.owner[tid]; ok && prev != next {
			if s := h.sessions[prev]; s != nil {
				delete(s.desired, tid)
				s.changed[tid] = struct{}{}
			}
			if next != "" {
				reassigned.Inc()
			}
		}
		if next == "" {
			delete(h.owner, tid)
			continue
		}
		h.owner[tid] = next
		if s := h.sessions[next]; s.desired[tid] != t {
			s.desired[tid] = t
			s.changed[tid] = struct{}{}
		}
	}
	clear(h.dirty)
	for _, id := range ids {
		s := h.sessions[id]
		assignments.WithLabelValues(id).Set(float64(len(s.desired)))
		if s.full || len(s.changed) > 0 {
			s.poke()
		}
	}
}

func (h *Hub) rebalancer(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		}
		h.rebalance()
		// Coalesce bursts of informer events.
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// send keeps one prober's set equal to its share until ctx ends or the
// stream fails. It is the stream's only sender, so the prober sees changes
// in the order they were made; what changed while it was sending goes out
// next, coalesced.
func (h *Hub) send(ctx context.Context, s *session) error {
	sent := map[string]*probev1.ProbeTarget{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		}
		h.mu.Lock()
		full := s.full
		var upsert []*probev1.ProbeTarget
		var remove []string
		if full {
			s.full = false
			sent = make(map[string]*probev1.ProbeTarget, len(s.desired))
			for tid, t := range s.desired {
				upsert = append(upsert, t)
				sent[tid] = t
			}
		} else {
			for tid := range s.changed {
				t, want := s.desired[tid]
				switch {
				case want && sent[tid] != t:
					upsert = append(upsert, t)
					sent[tid] = t
				case !want && sent[tid] != nil:
					remove = append(remove, tid)
					delete(sent, tid)
				}
			}
		}
		clear(s.changed)
		h.mu.Unlock()
		for _, m := range assignment.Split(full, upsert, remove, h.opts.MaxMessageBytes) {
			if err := s.stream.Send(&probev1.ConnectResponse{Message: &probev1.ConnectResponse_Assignment{Assignment: m}}); err != nil {
				return err
			}
		}
	}
}

// Connect implements ProbeService.
func (h *Hub) Connect(stream probev1.ProbeService_ConnectServer) error {
	select {
	case <-h.elected:
	default:
		return status.Error(codes.Unavailable, "this controller replica is not the leader; reconnect to reach the leader")
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil || hello.GetProberId() == "" {
		return status.Error(codes.InvalidArgument, "the first message must be hello with a prober_id")
	}
	if len(hello.GetProberId()) > 253 {
		return status.Error(codes.InvalidArgument, "prober_id must be at most 253 characters")
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	s := &session{id: hello.GetProberId(), stream: stream, full: true, wake: make(chan struct{}, 1),
		desired: map[string]*probev1.ProbeTarget{}, changed: map[string]struct{}{}}
	h.mu.Lock()
	if _, ok := h.sessions[s.id]; ok {
		// A live stream keeps its id: taking it over would evict a prober
		// and take its share. A prober that reconnects after its old
		// stream died unnoticed waits out keepalive (15s at most).
		h.mu.Unlock()
		return status.Errorf(codes.AlreadyExists, "prober_id %q is connected on another stream; ids must be unique (the pod name), and a restarted prober is let in once keepalive ends its old stream", s.id)
	}
	h.sessions[s.id] = s
	h.regroup = true
	probersConnected.Set(float64(len(h.sessions)))
	h.trigger()
	h.mu.Unlock()
	go func() {
		if err := h.send(ctx, s); err != nil {
			h.log.Warn("sending an assignment failed; ending the stream", "prober", s.id, "err", err)
			cancel()
		}
	}()
	h.log.Info("prober connected", "prober", s.id, "capacity", hello.GetCapacity())
	defer func() {
		h.mu.Lock()
		if h.sessions[s.id] == s {
			delete(h.sessions, s.id)
			h.regroup = true
			assignments.DeleteLabelValues(s.id)
		}
		probersConnected.Set(float64(len(h.sessions)))
		h.trigger()
		h.mu.Unlock()
		h.log.Info("prober disconnected", "prober", s.id)
	}()

	msgs := make(chan *probev1.ConnectRequest)
	errc := make(chan error, 1)
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return status.Error(codes.Aborted, "stream closed")
		case err := <-errc:
			return err
		case m := <-msgs:
			for _, r := range h.accepted(s, m.GetResults().GetResults()) {
				h.engine.Handle(ctx, s.id, r)
			}
		}
	}
}

// accepted keeps the results a stream may report: about a proxy assigned
// to it, and well formed. A prober can neither speak for a proxy it was
// not given nor write an egress IP that is not one.
func (h *Hub) accepted(s *session, rs []*probev1.ProbeResult) []*probev1.ProbeResult {
	out := rs[:0]
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range rs {
		t, mine := s.desired[r.GetId()]
		switch {
		case !mine || t.GetUid() != r.GetUid():
			rejected.WithLabelValues("unassigned").Inc()
		case r.GetEgressIp() != "" && net.ParseIP(r.GetEgressIp()) == nil:
			rejected.WithLabelValues("invalid").Inc()
			h.log.Warn("a result's egress IP is not an IP; result dropped", "prober", s.id, "proxy", r.GetId(), "egressIP", sanitize.Text(r.GetEgressIp(), 64))
		default:
			out = append(out, r)
		}
	}
	return out
}
