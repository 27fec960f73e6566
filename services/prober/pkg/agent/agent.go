// Package agent is the prober's side of the probe stream: it connects to
// the controller, keeps the set of proxies assigned to it, probes each on
// its interval with bounded concurrency, and streams results back. When the
// stream breaks (controller restart, leader change) it reconnects with
// jittered backoff and receives a full assignment again.
package agent

import (
	"container/heap"
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

var (
	probes        = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "prober_probes_total", Help: "Probes run by result (success, failure) and failing phase."}, []string{"result", "phase"})
	probeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "prober_probe_duration_seconds", Help: "Probe latency.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})
	assigned  = prometheus.NewGauge(prometheus.GaugeOpts{Name: "prober_assigned_targets", Help: "Proxies assigned to this prober."})
	connected = prometheus.NewGauge(prometheus.GaugeOpts{Name: "prober_connected", Help: "1 while the stream to the controller is up."})
	inflight  = prometheus.NewGauge(prometheus.GaugeOpts{Name: "prober_probes_in_flight", Help: "Probes running now (bounded by --concurrency)."})
)

// Collectors are the agent's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{probes, probeDuration, assigned, connected, inflight}
}

// Agent is one prober.
type Agent struct {
	ID string
	// Concurrency bounds probes in flight, and so file descriptors.
	Concurrency int
	Prober      *probe.Prober
	Conn        grpc.ClientConnInterface
	CallOptions []grpc.CallOption
	Log         *slog.Logger
	// BackoffMax caps the reconnect delay.
	BackoffMax time.Duration
}

// Run connects and reconnects until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	client := probev1.NewProbeServiceClient(a.Conn)
	backoff := 250 * time.Millisecond
	if a.BackoffMax == 0 {
		a.BackoffMax = 30 * time.Second
	}
	for ctx.Err() == nil {
		started := time.Now()
		err := a.session(ctx, client)
		connected.Set(0)
		if ctx.Err() != nil {
			return nil
		}
		if time.Since(started) > 30*time.Second {
			backoff = 250 * time.Millisecond
		}
		wait := time.Duration(float64(backoff) * (0.5 + rand.Float64()))
		a.Log.Warn("probe stream ended; reconnecting", "err", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		backoff = min(backoff*2, a.BackoffMax)
	}
	return nil
}

func (a *Agent) session(ctx context.Context, client probev1.ProbeServiceClient) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Connect(ctx, a.CallOptions...)
	if err != nil {
		return err
	}
	if err := stream.Send(&probev1.ConnectRequest{Message: &probev1.ConnectRequest_Hello{Hello: &probev1.Hello{ProberId: a.ID, Capacity: int32(a.Concurrency)}}}); err != nil {
		if !errors.Is(err, io.EOF) {
			return err
		}
		// The controller ended the stream first (not the leader, bad
		// token): gRPC reports that as EOF on Send and the reason on Recv.
		_, err = stream.Recv()
		return err
	}
	s := newScheduler(a.Concurrency)
	results := make(chan *probev1.ProbeResult, 1024)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.run(ctx, a.Prober, results) }()
	sendErr := make(chan error, 1)
	go func() { defer wg.Done(); sendErr <- a.sendResults(ctx, stream, results) }()
	defer func() { cancel(); wg.Wait(); assigned.Set(0) }()

	first := true
	for {
		msg, err := stream.Recv()
		if err != nil {
			return err
		}
		if first {
			connected.Set(1)
			a.Log.Info("connected to the controller", "prober", a.ID)
			first = false
		}
		if as := msg.GetAssignment(); as != nil {
			s.apply(as)
			assigned.Set(float64(s.size()))
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

// sendResults batches results: a batch goes out every 100ms or at 256.
func (a *Agent) sendResults(ctx context.Context, stream probev1.ProbeService_ConnectClient, results <-chan *probev1.ProbeResult) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var batch []*probev1.ProbeResult
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := stream.Send(&probev1.ConnectRequest{Message: &probev1.ConnectRequest_Results{Results: &probev1.ProbeResults{Results: batch}}})
		batch = nil
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-results:
			batch = append(batch, r)
			if len(batch) >= 256 {
				if err := flush(); err != nil {
					return err
				}
			}
		case <-tick.C:
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// task is one assigned proxy.
type task struct {
	target *probev1.ProbeTarget
	due    time.Time
	index  int
}

type queue []*task

func (q queue) Len() int           { return len(q) }
func (q queue) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q queue) Swap(i, j int)      { q[i], q[j] = q[j], q[i]; q[i].index = i; q[j].index = j }
func (q *queue) Push(x any)        { t := x.(*task); t.index = len(*q); *q = append(*q, t) }
func (q *queue) Pop() any {
	old := *q
	t := old[len(old)-1]
	*q = old[:len(old)-1]
	t.index = -1
	return t
}

// scheduler runs every task at its interval from one goroutine; probes
// run in goroutines bounded by a semaphore.
type scheduler struct {
	mu    sync.Mutex
	tasks map[string]*task
	q     queue
	wake  chan struct{}
	sem   chan struct{}
}

func newScheduler(concurrency int) *scheduler {
	return &scheduler{tasks: map[string]*task{}, wake: make(chan struct{}, 1), sem: make(chan struct{}, concurrency)}
}

func (s *scheduler) size() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.tasks) }

func interval(t *probev1.ProbeTarget) time.Duration {
	d := t.GetSettings().GetInterval().AsDuration()
	if d <= 0 {
		return 30 * time.Second
	}
	return d
}

// apply changes the set. A new target is first probed at a random point
// within its interval, so a reassignment burst spreads out but every proxy
// is probed within one interval of arriving.
func (s *scheduler) apply(a *probev1.Assignment) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.GetFull() {
		keep := map[string]bool{}
		for _, t := range a.GetUpsert() {
			keep[t.GetId()] = true
		}
		for id := range s.tasks {
			if !keep[id] {
				s.removeLocked(id)
			}
		}
	}
	for _, id := range a.GetRemove() {
		s.removeLocked(id)
	}
	now := time.Now()
	for _, t := range a.GetUpsert() {
		if old, ok := s.tasks[t.GetId()]; ok {
			old.target = t
			continue
		}
		tk := &task{target: t, due: now.Add(time.Duration(rand.Int64N(int64(interval(t)))))}
		s.tasks[t.GetId()] = tk
		heap.Push(&s.q, tk)
	}
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *scheduler) removeLocked(id string) {
	if t, ok := s.tasks[id]; ok {
		delete(s.tasks, id)
		if t.index >= 0 {
			heap.Remove(&s.q, t.index)
		}
	}
}

func (s *scheduler) run(ctx context.Context, p *probe.Prober, out chan<- *probev1.ProbeResult) {
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		var next time.Duration = time.Hour
		var due []*probev1.ProbeTarget
		now := time.Now()
		for s.q.Len() > 0 && !s.q[0].due.After(now) {
			t := s.q[0]
			due = append(due, t.target)
			t.due = t.due.Add(interval(t.target))
			if t.due.Before(now) { // fell behind: do not burst to catch up
				t.due = now.Add(interval(t.target))
			}
			heap.Fix(&s.q, 0)
		}
		if s.q.Len() > 0 {
			next = time.Until(s.q[0].due)
		}
		s.mu.Unlock()

		for _, t := range due {
			select {
			case s.sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			wg.Add(1)
			inflight.Inc()
			go func() {
				defer func() { <-s.sem; inflight.Dec(); wg.Done() }()
				r := runOne(ctx, p, t)
				select {
				case out <- r:
				case <-ctx.Done():
				}
			}()
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			return
		case <-s.wake:
		case <-timer.C:
		}
	}
}

var tracer = otel.Tracer("egress-proxies/prober")

func runOne(ctx context.Context, p *probe.Prober, t *probev1.ProbeTarget) *probev1.ProbeResult {
	st := t.GetSettings()
	var traceparent string
	if st.GetTrace() {
		sctx, sp := tracer.Start(ctx, "probe", trace.WithAttributes(attribute.String("proxy", t.GetId()), attribute.String("proxy.address", t.GetAddress())))
		defer sp.End()
		carrier := propagation.MapCarrier{}
		otel.GetTextMapPropagator().Inject(sctx, carrier)
		traceparent = carrier["traceparent"]
		ctx = sctx
	}
	timeout := st.GetTimeout().AsDuration()
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	res := p.Do(ctx, joinHostPort(t.GetAddress(), t.GetPort()), probe.Settings{
		URL: st.GetUrl(), ExpectedStatus: int(st.GetExpectedStatus()), Timeout: timeout, EchoFormat: st.GetEchoFormat(),
	})
	result := "success"
	if !res.Success {
		result = "failure"
	}
	probes.WithLabelValues(result, phaseName(res.Phase)).Inc()
	probeDuration.Observe(res.Latency.Seconds())
	return &probev1.ProbeResult{
		Id: t.GetId(), Uid: t.GetUid(), Success: res.Success, Latency: durationpb.New(res.Latency),
		Phase: res.Phase, Reason: res.Reason, FinishedAt: timestamppb.Now(), EgressIp: res.EgressIP, Traceparent: traceparent,
	}
}

func phaseName(p probev1.ProbePhase) string {
	if p == probev1.ProbePhase_PROBE_PHASE_UNSPECIFIED {
		return "none"
	}
	return probev1.ProbePhase_name[int32(p)][len("PROBE_PHASE_"):]
}

func joinHostPort(host string, port int32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
