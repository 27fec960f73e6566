package broker

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// event is one watch event as a test compares it: "UPSERT a0",
// "DELETE a0", "SYNCED"; health shows as "UPSERT a0 unhealthy".
func event(e *leasev1.ProxyEvent) string {
	s := e.GetType().String()[len("TYPE_"):]
	if p := e.GetProxy(); p != nil {
		s += " " + p.GetId()[len(p.GetId())-2:]
		if e.GetType() == leasev1.ProxyEvent_TYPE_UPSERT && !p.GetHealthy() {
			s += " unhealthy"
		}
	}
	return s
}

// next collects events from ch until want has come, in order, or fails.
func next(t *testing.T, ch <-chan string, want ...string) {
	t.Helper()
	for i, w := range want {
		select {
		case got, ok := <-ch:
			require.True(t, ok, "the watch ended before %q (%d of %v)", w, i, want)
			require.Equal(t, w, got, "event %d of %v", i, want)
		case <-time.After(30 * time.Second):
			t.Fatalf("no event %q (%d of %v) in 30s", w, i, want)
		}
	}
}

// WatchProxies over gRPC and REST: the first set, SYNCED, then each change
// to the watched set as it happens, filtered (a proxy that stops matching
// is a DELETE to a filter it left, an UPSERT to one it is still in); the
// token is required on both.
func TestWatchProxiesSendsTheSetThenItsChanges(t *testing.T) {
	f := newFleet(t)
	f.add("a0", "127.0.0.90", map[string]string{"geo": "eu"})
	f.add("a1", "127.0.0.91", map[string]string{"geo": "us"})
	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("crawler:watch-token\n"), 0o600))
	b := startBroker(t, f, proc.StartRedis(t, false), "--token-file", tokenFile)
	conn, err := grpc.NewClient(b.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	api := leasev1.NewLeaseServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	_, err = func() (*leasev1.WatchProxiesResponse, error) {
		s, err := api.WatchProxies(ctx, &leasev1.WatchProxiesRequest{})
		if err != nil {
			return nil, err
		}
		return s.Recv()
	}()
	assert.Equal(t, codes.Unauthenticated, status.Code(err), "gRPC without the token")
	resp, err := http.Get(b.REST + "/v1/proxies:watch")
	require.NoError(t, err)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "REST without the token")

	// gRPC: every proxy with geo=eu, whatever its health.
	stream, err := api.WatchProxies(ctx, &leasev1.WatchProxiesRequest{Selector: map[string]string{"geo": "eu"}}, auth.Static("watch-token").PerRPC())
	require.NoError(t, err)
	viaGRPC := make(chan string, 64)
	go func() {
		defer close(viaGRPC)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			for _, e := range r.GetEvents() {
				viaGRPC <- event(e)
			}
		}
	}()
	// REST: the healthy ones with geo=eu.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.REST+"/v1/proxies:watch?healthy=true&geo=eu", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer watch-token")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/x-ndjson", resp.Header.Get("Content-Type"))
	viaREST := make(chan string, 64)
	go func() {
		defer close(viaREST)
		defer func() { _ = resp.Body.Close() }()
		lines := bufio.NewScanner(resp.Body)
		for lines.Scan() {
			var line struct {
				Result json.RawMessage
			}
			var r leasev1.WatchProxiesResponse
			if json.Unmarshal(lines.Bytes(), &line) != nil || protojson.Unmarshal(line.Result, &r) != nil {
				viaREST <- "unreadable: " + lines.Text()
				return
			}
			for _, e := range r.GetEvents() {
				viaREST <- event(e)
			}
		}
	}()
	next(t, viaGRPC, "UPSERT a0", "SYNCED")
	next(t, viaREST, "UPSERT a0", "SYNCED")

	// A new proxy is created, then its status written: a watch of every
	// health may see it unhealthy first.
	f.add("a2", "127.0.0.92", map[string]string{"geo": "eu"})
	if first := <-viaGRPC; first != "UPSERT a2" {
		require.Equal(t, "UPSERT a2 unhealthy", first)
		next(t, viaGRPC, "UPSERT a2")
	}
	next(t, viaREST, "UPSERT a2")

	set := func(name string, mutate func(*v1.Proxy), status bool) {
		var px v1.Proxy
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: name}, &px))
		mutate(&px)
		if status {
			require.NoError(t, env.Client.Status().Update(ctx, &px))
		} else {
			require.NoError(t, env.Client.Update(ctx, &px))
		}
	}
	set("a1", func(px *v1.Proxy) { px.Spec.Attributes["geo"] = "eu" }, false)
	next(t, viaGRPC, "UPSERT a1")
	next(t, viaREST, "UPSERT a1")
	set("a0", func(px *v1.Proxy) { px.Status.Healthy = false }, true)
	next(t, viaGRPC, "UPSERT a0 unhealthy")
	next(t, viaREST, "DELETE a0")
	require.NoError(t, env.Client.Delete(ctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "a2"}}))
	next(t, viaGRPC, "DELETE a2")
	next(t, viaREST, "DELETE a2")

	// A change outside both sets sends nothing: the next event either
	// sees is the one after it.
	f.add("a3", "127.0.0.93", map[string]string{"geo": "us"})
	set("a1", func(px *v1.Proxy) { px.Spec.Attributes["geo"] = "us" }, false)
	next(t, viaGRPC, "DELETE a1")
	next(t, viaREST, "DELETE a1")
}

// A REST watch outlives the port's read timeout: net/http cancels a
// request's context when its connection's read deadline passes
// (golang/go#70834), which ended every watch silently at
// --http-read-timeout; the watch clears that deadline once its request is
// read, and a change long after it still arrives.
func TestRESTWatchOutlivesTheReadTimeout(t *testing.T) {
	f := newFleet(t)
	f.add("r0", "127.0.0.94", nil)
	b := startBroker(t, f, proc.StartRedis(t, false), "--http-read-timeout", "1s")
	b.WaitListed(1)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.REST+"/v1/proxies:watch", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		defer func() { _ = resp.Body.Close() }()
		s := bufio.NewScanner(resp.Body)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	for synced := false; !synced; {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the watch ended before SYNCED")
			synced = strings.Contains(l, "TYPE_SYNCED")
		case <-time.After(30 * time.Second):
			t.Fatal("no SYNCED")
		}
	}
	time.Sleep(3 * time.Second) // three read timeouts
	f.add("r1", "127.0.0.95", nil)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the watch ended silently")
			require.NotContains(t, l, `"error"`)
			if strings.Contains(l, "/r1") {
				return
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the change after the read timeout never arrived")
		}
	}
}
