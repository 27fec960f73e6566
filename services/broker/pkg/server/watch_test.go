package server

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/broker/internal/brokertest"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// smallBuffers makes a socket's kernel buffers a few KiB, so a client
// that stops reading holds the server's writes after a few lines.
func smallBuffers(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		if serr == nil {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// restWatch serves GET /v1/proxies:watch of a real lease service (on the
// envtest API server and Redis) on loopback with small socket buffers;
// returned is its address and a channel that gets a value each time a
// watch's handler has returned.
func restWatch(t *testing.T, sendTimeout time.Duration, proxies, attrs int) (string, <-chan struct{}) {
	s := brokertest.New(t, env, nil)
	big := map[string]string{}
	for i := range attrs {
		big[fmt.Sprintf("attribute-%02d-%s", i, strings.Repeat("k", 40))] = strings.Repeat("v", 63)
	}
	for i := range proxies {
		s.Proxy(t, fmt.Sprintf("w%03d", i), fmt.Sprintf("127.0.3.%d", i+1), big)
	}
	cfg := leases.DefaultConfig
	cfg.WatchSendTimeout = sendTimeout
	svc := leases.New(s.Inv, s.Store, s.Index, &policy.Policies{Defaults: leases.DefaultPolicy}, cfg)
	go svc.RunWatches(t.Context())
	pass := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return h(srv, ss)
	}
	h := watchREST(runtime.NewServeMux(), rest{svc: leases.GRPC(svc), sic: pass}, time.Minute)
	returned := make(chan struct{}, 16)
	lc := net.ListenConfig{Control: smallBuffers}
	ln, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		returned <- struct{}{}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String(), returned
}

// A REST watcher that stops reading is cut once a line has waited
// sendTimeout; the handler returns only after its writer is done (run
// with -race: a writer still writing after the handler returned would
// share the answer's buffer with net/http's pool), and writes no error
// line over the stuck one.
func TestARESTWatcherThatStopsReadingIsCutCleanly(t *testing.T) {
	addr, returned := restWatch(t, 500*time.Millisecond, 40, 30)
	d := net.Dialer{Control: smallBuffers}
	c, err := d.DialContext(t.Context(), "tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET /v1/proxies:watch HTTP/1.1\r\nHost: broker\r\n\r\n")
	require.NoError(t, err)
	// It reads nothing: the first set (about 150 KB) fills the buffers.
	select {
	case <-returned:
	case <-time.After(20 * time.Second):
		t.Fatal("the handler of a watcher that stopped reading never returned")
	}
	// What it was sent ends without an error line written after the cut.
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	body, _ := bufio.NewReader(c).ReadString(0)
	assert.Contains(t, body, "200 OK")
	assert.NotContains(t, body, `{"error"`)
}

// A quiet watch (nothing changes) outlives many send timeouts: only a
// send is timed, not the gaps between them; and it ends when its client
// leaves.
func TestAQuietRESTWatchIsNotEnded(t *testing.T) {
	addr, returned := restWatch(t, time.Second, 1, 0)
	resp, err := http.Get("http://" + addr + "/v1/proxies:watch")
	require.NoError(t, err)
	defer resp.Body.Close()
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	deadline := time.After(4 * time.Second) // four send timeouts of quiet
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the quiet watch was ended")
			require.NotContains(t, l, `"error"`)
		case <-returned:
			t.Fatal("the quiet watch's handler returned")
		case <-deadline:
			// The client leaves while the watch waits for a change: the
			// handler, which waits for its writer, still returns.
			_ = resp.Body.Close()
			select {
			case <-returned:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler of a watch whose client left never returned")
			}
			return
		}
	}
}
