package broker

import (
	"context"
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// With --tls-cert-file the broker serves gRPC and REST over TLS only; the
// Go client dials it with the CA, and a plaintext caller gets nowhere.
func TestTLSOnGRPCAndREST(t *testing.T) {
	f := newFleet(t)
	f.add("t0", "127.0.0.90", nil)
	ca, err := certs.NewCA("broker test CA")
	require.NoError(t, err)
	files, err := ca.WriteServer(t.TempDir(), "127.0.0.1", "localhost")
	require.NoError(t, err)
	b := startBroker(t, f, proc.StartRedis(t, false), "--tls-cert-file", files.Cert, "--tls-key-file", files.Key)
	assert.Contains(t, b.P.Log(), `"tls":true`)

	clientTLS, err := certs.ClientConfig(files.CA, "")
	require.NoError(t, err)
	c, err := leaseclient.Dial(b.GRPC, leaseclient.WithTLS(credentials.NewTLS(clientTLS)))
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.Eventually(t, func() bool {
		l, err := c.Lease(ctx, leaseclient.Request{TTL: time.Minute})
		if err != nil {
			return false
		}
		return assert.NoError(t, l.Release(ctx))
	}, 30*time.Second, 100*time.Millisecond, "a lease over TLS")

	plain, err := leaseclient.Dial(b.GRPC)
	require.NoError(t, err)
	defer func() { _ = plain.Close() }()
	_, err = plain.API().ListProxies(ctx, &leasev1.ListProxiesRequest{})
	assert.Equal(t, codes.Unavailable, status.Code(err), "a plaintext gRPC caller: %v", err)

	https := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 10 * time.Second}
	resp, err := https.Get("https://" + b.REST[len("http://"):] + "/v1/proxies")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	resp, err = http.Get(b.REST + "/v1/proxies")
	if err == nil {
		_ = resp.Body.Close()
		assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "Go's TLS server answers plain HTTP with 400")
	}
	untrusted := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS12}}, Timeout: 10 * time.Second}
	_, err = untrusted.Get("https://" + b.REST[len("http://"):] + "/v1/proxies")
	assert.ErrorContains(t, err, "certificate", "a client without the CA does not trust it")
}

// The gRPC health service says whether this broker can lease: NOT_SERVING
// while Redis is down, SERVING again once it is back. Reflection lists
// the API for grpcurl.
func TestGRPCHealthFollowsRedisAndReflectionListsTheAPI(t *testing.T) {
	f := newFleet(t)
	r := proc.StartRedis(t, false)
	b := startBroker(t, f, r)
	conn, err := grpc.NewClient(b.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	hc := healthpb.NewHealthClient(conn)
	statusOf := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		resp, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN
		}
		return resp.GetStatus()
	}
	lease := leasev1.LeaseService_ServiceDesc.ServiceName
	require.Eventually(t, func() bool {
		return statusOf("") == healthpb.HealthCheckResponse_SERVING && statusOf(lease) == healthpb.HealthCheckResponse_SERVING
	}, 20*time.Second, 100*time.Millisecond)
	r.Kill()
	require.Eventually(t, func() bool {
		return statusOf("") == healthpb.HealthCheckResponse_NOT_SERVING && statusOf(lease) == healthpb.HealthCheckResponse_NOT_SERVING
	}, 20*time.Second, 100*time.Millisecond, "NOT_SERVING while Redis is down")
	r.Start()
	require.Eventually(t, func() bool { return statusOf(lease) == healthpb.HealthCheckResponse_SERVING }, 30*time.Second, 100*time.Millisecond)

	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	require.NoError(t, err)
	require.NoError(t, stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}))
	resp, err := stream.Recv()
	require.NoError(t, err)
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	assert.Contains(t, names, lease)
	assert.Contains(t, names, "grpc.health.v1.Health")
}
