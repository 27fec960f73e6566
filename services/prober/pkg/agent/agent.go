// Package agent is the prober's side of the probe stream: it connects to
// the controller, keeps the set of proxies assigned to it, probes each on
// its interval with bounded concurrency, and streams results back. When the
// stream breaks (controller restart, leader change) it reconnects with
// jittered backoff, over a new connection, and receives a full assignment
// again. The schedule outlives the stream: a reconnect keeps every known
// proxy's place in it, so a controller failover neither pauses probing nor
// bunches it up.
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
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/egress-proxies/egress-proxies/pkg/assignment"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/probespec"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

var (
	probes        = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_prober_probes_total", Help: "Probes run by result (success, failure) and failing phase."}, []string{"result", "phase"})
	probeDuration = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "proxy_operator_prober_probe_duration_seconds", Help: "Probe latency.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})
	assigned  = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_prober_assigned_targets", Help: "Proxies assigned to this prober."})
	connected = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_prober_connected", Help: "1 while the stream to the controller is up."})
	inflight  = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_prober_probes_in_flight", Help: "Probes running now (bounded by --concurrency)."})
	dropped   = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_prober_results_dropped_total", Help: "Results dropped because the controller took them in more slowly than they were made, or no stream was up."})
	skipped   = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_prober_probes_skipped_total", Help: "Probes not started because the proxy's previous probe was still running (its timeout is longer than its interval, or the prober is behind)."})
)

// Collectors are the agent's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{probes, probeDuration, assigned, connected, inflight, dropped, skipped}
}

// resultBuffer is how many results wait for the stream before new ones
// are dropped. Dropping beats blocking: a blocked result would hold a probe
// slot, and the controller only needs the newest results anyway.
const resultBuffer = 4096

// Agent is one prober.
type Agent struct {
	ID string
	// Concurrency bounds probes in flight, and so file descriptors.
	Concurrency int
	Prober      *probe.Prober
	// Dial opens a new connection to the controller's probe endpoint; each
	// stream gets its own. A Kubernetes Service balances connections, not
	// streams: a follower refuses the stream, and a retry over the same
	// connection would reach the same follower for as long as it lives.
	Dial        func() (*grpc.ClientConn, error)
	CallOptions []grpc.CallOption
	Log         *slog.Logger
	// BackoffMax caps the reconnect delay; 0 means DefaultBackoffMax.
	BackoffMax time.Duration

	once    sync.Once
	sched   *scheduler
	results chan *probev1.ProbeResult
}

func (a *Agent) init() {
	a.once.Do(func() {
		a.sched = newScheduler(a.Concurrency)
		a.results = make(chan *probev1.ProbeResult, resultBuffer)
	})
}

// DefaultBackoffMax caps the reconnect delay. It is short because every
// second without a stream is a second of results the leader does not get:
// after a failover the new leader must hear about every proxy within two
// intervals, and a refused or failed attempt costs a controller next to
// nothing (no assignment is sent before the hello is accepted).
const DefaultBackoffMax = 2 * time.Second

// Run connects and reconnects until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.init()
	backoff := 250 * time.Millisecond
	if a.BackoffMax == 0 {
		a.BackoffMax = DefaultBackoffMax
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { a.sched.run(ctx, a.Prober, a.results) })
	for ctx.Err() == nil {
		started := time.Now()
		err := a.dialSession(ctx)
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

// dialSession runs one session over a connection of its own.
func (a *Agent) dialSession(ctx context.Context) error {
	conn, err := a.Dial()
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	return a.session(ctx, probev1.NewProbeServiceClient(conn))
}

func (a *Agent) session(ctx context.Context, client probev1.ProbeServiceClient) error {
	a.init()
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
	var wg sync.WaitGroup
	sendErr := make(chan error, 1)
	wg.Go(func() { sendErr <- a.sendResults(ctx, stream, a.results) })
	defer func() { cancel(); wg.Wait() }()

	// A large full assignment arrives in chunks; it replaces the set only
	// once whole, so no target is dropped and re-added on the way.
	var asm assignment.Assembler
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
			if whole := asm.Add(as); whole != nil {
				a.sched.apply(whole)
				assigned.Set(float64(a.sched.size()))
			}
		}
		select {
		case err := <-sendErr:
			return err
		default:
		}
	}
}

// maxBatchBytes bounds one results message, far below the 4 MiB the
// controller accepts, whatever the results hold.
const maxBatchBytes = 1 << 20

// sendResults batches results: a batch goes out every 100ms, at 256
// results, or at maxBatchBytes.
func (a *Agent) sendResults(ctx context.Context, stream probev1.ProbeService_ConnectClient, results <-chan *probev1.ProbeResult) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var batch []*probev1.ProbeResult
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := stream.Send(&probev1.ConnectRequest{Message: &probev1.ConnectRequest_Results{Results: &probev1.ProbeResults{Results: batch}}})
		batch, size = nil, 0
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case r := <-results:
			n := proto.Size(r) + 8 // and its framing within the batch
			if size+n > maxBatchBytes {
				if err := flush(); err != nil {
					return err
				}
			}
			batch = append(batch, r)
			size += n
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
	// probed: the first probe has been started.
	probed bool
	// running: a probe of it is in flight. One at a time: a proxy that
	// never answers must hold one probe slot, not one per interval.
	running bool
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
// run on a fixed set of concurrency workers, which keep the stacks a TLS
// handshake grows (a goroutine per probe grew a fresh one every time).
type scheduler struct {
	mu          sync.Mutex
	tasks       map[string]*task
	q           queue
	wake        chan struct{}
	concurrency int
}

func newScheduler(concurrency int) *scheduler {
	return &scheduler{tasks: map[string]*task{}, wake: make(chan struct{}, 1), concurrency: concurrency}
}

func (s *scheduler) size() int { s.mu.Lock(); defer s.mu.Unlock(); return len(s.tasks) }

func interval(t *probev1.ProbeTarget) time.Duration {
	d := t.GetSettings().GetInterval().AsDuration()
	if d <= 0 {
		return probespec.DefaultInterval
	}
	return d
}

// firstProbeWindow spreads the first probes of targets that arrive
// together (a new fleet, a dead prober's share) over at most this long.
const firstProbeWindow = time.Second

// apply changes the set. A new target is probed promptly, within
// firstProbeWindow: a new proxy should be proven as soon as it can be, and
// a dead prober's share should not wait out an interval. Its second probe
// then falls at a random point in the second half of its interval, which
// gives each proxy its own phase, so a fleet that arrived at once is not
// probed at once ever after. A target already held keeps its schedule.
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
		tk := &task{target: t, due: now.Add(time.Duration(rand.Int64N(int64(min(interval(t), firstProbeWindow)))))}
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

// start is one probe handed to a worker. The target is taken when the
// probe falls due: apply may change the task's meanwhile.
type start struct {
	task   *task
	target *probev1.ProbeTarget
}

func (s *scheduler) run(ctx context.Context, p *probe.Prober, out chan<- *probev1.ProbeResult) {
	work := make(chan start)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(work)
	for range s.concurrency {
		wg.Go(func() {
			for d := range work {
				inflight.Inc()
				r := runOne(ctx, p, d.target)
				inflight.Dec()
				s.mu.Lock()
				d.task.running = false
				s.mu.Unlock()
				select {
				case out <- r:
				default:
					dropped.Inc()
				}
			}
		})
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		var next time.Duration = time.Hour
		var due []start
		now := time.Now()
		for s.q.Len() > 0 && !s.q[0].due.After(now) {
			t := s.q[0]
			if t.running {
				skipped.Inc()
			} else {
				t.running = true
				due = append(due, start{t, t.target})
			}
			every := interval(t.target)
			switch {
			case !t.probed:
				t.probed = true
				t.due = now.Add(every/2 + time.Duration(rand.Int64N(int64(every/2)+1)))
			case t.due.Add(every).Before(now): // fell behind: do not burst to catch up
				t.due = now.Add(every)
			default:
				t.due = t.due.Add(every)
			}
			heap.Fix(&s.q, 0)
		}
		if s.q.Len() > 0 {
			next = time.Until(s.q[0].due)
		}
		s.mu.Unlock()

		for _, d := range due {
			select {
			case work <- d:
			case <-ctx.Done():
				return
			}
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
		timeout = probespec.DefaultTimeout
	}
	res := p.Do(ctx, joinHostPort(t.GetAddress(), t.GetPort()), probe.Settings{
		URL: st.GetUrl(), ExpectedStatus: int(st.GetExpectedStatus()), Timeout: timeout, EchoFormat: st.GetEchoFormat(),
		Credentials: proxyauth.Credentials{Username: t.GetCredentials().GetUsername(), Password: t.GetCredentials().GetPassword()},
	})
	result := "success"
	if !res.Success {
		result = "failure"
	}
	probes.WithLabelValues(result, probespec.PhaseName(res.Phase)).Inc()
	probeDuration.Observe(res.Latency.Seconds())
	return &probev1.ProbeResult{
		Id: t.GetId(), Uid: t.GetUid(), Success: res.Success, Latency: durationpb.New(res.Latency),
		Phase: res.Phase, Reason: res.Reason, FinishedAt: timestamppb.Now(), EgressIp: res.EgressIP, Traceparent: traceparent, Bytes: res.Bytes,
	}
}

func joinHostPort(host string, port int32) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
