package agent

import (
	"context"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
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
