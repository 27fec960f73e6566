package leaseclient_test

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// The client against a real broker process, real Redis and a real API server.
func TestLeaseRenewReportRelease(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ns := env.Namespace(t, "client")
	env.ReadyProxy(t, ns, "client-p", "127.0.0.90", 3128, map[string]string{"geo": "eu"}, true)

	r := proc.StartRedis(t, false)
	kc, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	tokenFile := t.TempDir() + "/token"
	require.NoError(t, os.WriteFile(tokenFile, []byte("crawler-token"), 0o600))
	grpcPort, ops := proc.FreePort(t), proc.FreePort(t)
	b := proc.Start(t, "broker", proc.Build(t, "github.com/egress-proxies/egress-proxies/services/broker/cmd/broker"),
		"--kubeconfig", kc, "--namespace", ns, "--redis-addrs", r.Addr, "--token-file", tokenFile, "--min-ttl", "1s",
		"--grpc-addr", proc.Addr(grpcPort), "--http-addr", proc.Addr(proc.FreePort(t)), "--ops-addr", proc.Addr(ops))
	proc.WaitHTTP(t, b, "http://"+proc.Addr(ops)+"/readyz", 60*time.Second)

	c, err := leaseclient.Dial(proc.Addr(grpcPort), leaseclient.WithToken("crawler-token"))
	require.NoError(t, err)
	defer func() { _ = c.Close() }()

	var l *leaseclient.Lease
	require.Eventually(t, func() bool {
		l, err = c.Lease(ctx, leaseclient.Request{Selector: map[string]string{"geo": "eu"}, Target: "example.com", TTL: 2 * time.Second})
		return err == nil
	}, 30*time.Second, 100*time.Millisecond)
	assert.Equal(t, "http://127.0.0.90:3128", l.ProxyURL().String())

	first := l.Expires()
	stop := l.AutoRenew(ctx, 300*time.Millisecond, 2*time.Second, nil)
	time.Sleep(2500 * time.Millisecond) // past the original TTL: only renewals keep it alive
	stop()
	assert.True(t, l.Expires().After(first), "auto-renew extended the lease")
	verdict, err := l.Report(ctx, leaseclient.Outcome{Result: leaseclient.ResultRateLimited, StatusCode: 429, Latency: 80 * time.Millisecond})
	require.NoError(t, err, "the lease is alive past its first TTL")
	assert.Equal(t, []string{"COOLDOWN_STARTED"}, verdict.GetActions())

	_, err = c.Lease(ctx, leaseclient.Request{Selector: map[string]string{"geo": "eu"}, Target: "example.com"})
	var none *leaseclient.NoProxyError
	require.True(t, errors.As(err, &none), "the only proxy cools down for example.com: %v", err)
	assert.Equal(t, "ALL_COOLING_DOWN", none.Reason)
	assert.Equal(t, time.Second, none.RetryAfter)
	assert.ErrorIs(t, err, leaseclient.ErrNoProxy)

	require.NoError(t, l.Release(ctx))
	require.NoError(t, l.Release(ctx))

	// A retried request gets the lease the first try made.
	req := leaseclient.Request{Selector: map[string]string{"geo": "eu"}, RequestID: "crawl-42"}
	mine, err := c.Lease(ctx, req)
	require.NoError(t, err)
	again, err := c.Lease(ctx, req)
	require.NoError(t, err)
	assert.Equal(t, mine.ID, again.ID)

	// Auto-renew stops, saying why, once the proxy turns unhealthy.
	lost := make(chan error, 1)
	stop = mine.AutoRenew(ctx, 100*time.Millisecond, 2*time.Second, func(err error) { lost <- err })
	defer stop()
	var px v1.Proxy
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "client-p"}, &px))
	px.Status.Healthy = false
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1.ReasonProbeFailed, Message: "test"})
	require.NoError(t, env.Client.Status().Update(ctx, &px))
	select {
	case err := <-lost:
		var le *leaseclient.LostError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, "PROXY_UNHEALTHY", le.Reason)
		assert.ErrorIs(t, err, leaseclient.ErrLeaseLost)
	case <-time.After(10 * time.Second):
		t.Fatal("auto-renew never reported the lease lost")
	}
}

// A lease of a proxy that asks for credentials gives a URL carrying them,
// so http.ProxyURL sends them on CONNECT.
func TestProxyURLCarriesTheCredentials(t *testing.T) {
	l := &leaseclient.Lease{Proxy: &leasev1.Proxy{Ip: "127.0.0.91", Port: 3128},
		Credentials: &leasev1.ProxyCredentials{Username: "ep-0123", Password: "p@ss:word"}}
	u := l.ProxyURL()
	assert.Equal(t, "ep-0123", u.User.Username())
	pw, _ := u.User.Password()
	assert.Equal(t, "p@ss:word", pw)
	assert.Equal(t, "127.0.0.91:3128", u.Host)
}

// recorder is a LeaseService on loopback that records what it is sent and
// answers UNAVAILABLE to the first call, as a broker whose Redis is failing
// over would.
type recorder struct {
	leasev1.UnimplementedLeaseServiceServer
	mu  sync.Mutex
	ids []string
}

func (r *recorder) CreateLease(_ context.Context, req *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, req.GetRequestId())
	if len(r.ids) == 1 {
		return nil, status.Error(codes.Unavailable, "failing over")
	}
	return &leasev1.CreateLeaseResponse{LeaseId: "l", Proxy: &leasev1.Proxy{Ip: "127.0.0.1", Port: 3128}}, nil
}

// Every CreateLease leaves with a request id, the raw API's too, and a
// retried one keeps it: a retry never takes a second proxy.
func TestEveryAcquireCarriesARequestID(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	rec := &recorder{}
	leasev1.RegisterLeaseServiceServer(srv, rec)
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	c, err := leaseclient.Dial(ln.Addr().String())
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	ctx := context.Background()

	_, err = c.Lease(ctx, leaseclient.Request{})
	require.NoError(t, err)
	_, err = c.API().CreateLease(ctx, &leasev1.CreateLeaseRequest{})
	require.NoError(t, err)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.ids, 3)
	assert.NotEmpty(t, rec.ids[0])
	assert.Equal(t, rec.ids[0], rec.ids[1], "Lease's retry after UNAVAILABLE repeats the id")
	assert.NotEmpty(t, rec.ids[2], "the raw API gets one too")
	assert.NotEqual(t, rec.ids[0], rec.ids[2])
}
