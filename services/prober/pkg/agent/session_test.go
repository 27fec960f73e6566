package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/assignment"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

// refusingHub ends every stream at once, as a follower or a hub that
// rejects the token does.
type refusingHub struct {
	probev1.UnimplementedProbeServiceServer
}

func (refusingHub) Connect(grpc.BidiStreamingServer[probev1.ConnectRequest, probev1.ConnectResponse]) error {
	return status.Error(codes.Unavailable, "this replica is not the leader")
}

// A stream the controller refuses ends with the controller's reason, which
// the agent logs, never a bare EOF: the refusal often arrives before the
// hello is sent, and gRPC then fails the Send with EOF. Repeated because
// which side wins is a race.
func TestRefusedSessionReportsTheControllersReason(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	probev1.RegisterProbeServiceServer(srv, refusingHub{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })

	a := &Agent{ID: "p", Concurrency: 1, Log: slog.Default()}
	client := probev1.NewProbeServiceClient(conn)
	for range 50 {
		err := a.session(context.Background(), client)
		require.Equal(t, codes.Unavailable, status.Code(err), "got %v", err)
		assert.Contains(t, err.Error(), "not the leader")
	}
}

// scriptedHub sends each stream the assignment messages of its script,
// one script per stream in order, and counts the results it is sent. A
// stream ends when the test closes its end channel.
type scriptedHub struct {
	probev1.UnimplementedProbeServiceServer
	scripts chan []*probev1.Assignment
	ends    chan chan struct{}
	mu      sync.Mutex
	results map[string]int
}

func (h *scriptedHub) Connect(stream grpc.BidiStreamingServer[probev1.ConnectRequest, probev1.ConnectResponse]) error {
	if _, err := stream.Recv(); err != nil { // hello
		return err
	}
	for _, m := range <-h.scripts {
		if err := stream.Send(&probev1.ConnectResponse{Message: &probev1.ConnectResponse_Assignment{Assignment: m}}); err != nil {
			return err
		}
	}
	end := make(chan struct{})
	h.ends <- end
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				return
			}
			h.mu.Lock()
			for _, r := range m.GetResults().GetResults() {
				h.results[r.GetId()]++
			}
			h.mu.Unlock()
		}
	}()
	select {
	case <-end:
		return status.Error(codes.Unavailable, "stream ended by the test")
	case <-stream.Context().Done():
		return nil
	}
}

func (h *scriptedHub) probed(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.results[id]
}

func startScripted(t *testing.T) (*scriptedHub, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := &scriptedHub{scripts: make(chan []*probev1.Assignment, 4), ends: make(chan chan struct{}, 4), results: map[string]int{}}
	srv := grpc.NewServer()
	probev1.RegisterProbeServiceServer(srv, h)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return h, lis.Addr().String()
}

func dialer(addr string) func() (*grpc.ClientConn, error) {
	return func() (*grpc.ClientConn, error) {
		return grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
}

func runAgent(t *testing.T, addr string) *Agent {
	t.Helper()
	a := &Agent{ID: "p", Concurrency: 64, Prober: &probe.Prober{}, Dial: dialer(addr), Log: slog.Default(), BackoffMax: 100 * time.Millisecond}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = a.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

// 50,000 targets with a 2,000-byte URL are about 100 MiB of
// assignment: it reaches the agent in chunks, each under gRPC's default
// 4 MiB receive limit (the agent's client keeps the default), and becomes
// the agent's set only once whole.
func TestFiftyThousandTargetsArriveInChunks(t *testing.T) {
	h, addr := startScripted(t)
	closed := proc.FreePort(t)
	url := "https://127.0.0.1:1/" + strings.Repeat("x", 2000)
	ts := make([]*probev1.ProbeTarget, 50000)
	for i := range ts {
		ts[i] = target(fmt.Sprintf("ns/p%05d", i), closed, time.Hour)
		ts[i].Settings.Url = url
	}
	msgs := assignment.Split(true, ts, nil, 0)
	require.Greater(t, len(msgs), 50)
	h.scripts <- msgs
	a := runAgent(t, addr)
	<-h.ends
	// The gauge is set just after the set is applied: wait for both, as
	// a scrape between the two may see the old figure.
	require.Eventually(t, func() bool {
		return a.sched.size() == len(ts) && testutil.ToFloat64(assigned) == float64(len(ts))
	}, 30*time.Second, 20*time.Millisecond, "the whole assignment becomes the set and the gauge")
	require.Eventually(t, func() bool { return h.probed("ns/p49999") > 0 && h.probed("ns/p00000") > 0 },
		30*time.Second, 20*time.Millisecond, "new targets are probed promptly, the last as the first")
}

// A reconnect (a controller failover) keeps the schedule: targets the
// prober already holds are not probed again early because the new stream
// assigned them again, and one that is new is probed at once.
func TestAReconnectKeepsTheSchedule(t *testing.T) {
	h, addr := startScripted(t)
	closed := proc.FreePort(t)
	known := target("ns/known", closed, time.Hour)
	h.scripts <- []*probev1.Assignment{{Full: true, Upsert: []*probev1.ProbeTarget{known}}}
	runAgent(t, addr)
	end := <-h.ends
	require.Eventually(t, func() bool { return h.probed("ns/known") == 1 }, 10*time.Second, 10*time.Millisecond, "a new target is probed within the first-probe window")

	h.scripts <- []*probev1.Assignment{{Full: true, More: true, Upsert: []*probev1.ProbeTarget{known}}, {Upsert: []*probev1.ProbeTarget{target("ns/new", closed, time.Hour)}}}
	close(end)
	<-h.ends
	require.Eventually(t, func() bool { return h.probed("ns/new") == 1 }, 10*time.Second, 10*time.Millisecond)
	time.Sleep(firstProbeWindow + 200*time.Millisecond)
	assert.Equal(t, 1, h.probed("ns/known"), "the hourly target was not probed again after the reconnect")
}
