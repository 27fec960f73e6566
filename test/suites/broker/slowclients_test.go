package broker

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// slowClients holds the connections of clients that take and never give:
// REST clients sending a request head a few bytes at a time and never
// finishing it (slowloris), gRPC clients that connect and never send the
// HTTP/2 preface, and gRPC connections opening more streams than allowed
// and never sending a message on them.
type slowClients struct {
	rest, grpc []net.Conn
	// streamConns are the HTTP/2 connections with idle streams; refused
	// counts the streams the server refused (RST_STREAM REFUSED_STREAM).
	streamConns []net.Conn
	mu          sync.Mutex
	refused     int
}

// open starts n clients of each kind but the last, which gets conns
// connections of streams streams each.
func openSlowClients(t testing.TB, restAddr, grpcAddr string, n, conns, streams int) *slowClients {
	s := &slowClients{}
	for range n {
		c, err := net.Dial("tcp", restAddr)
		require.NoError(t, err)
		_, err = c.Write([]byte("POST /v1/leases HTTP/1.1\r\nHost: broker\r\nX-Slow: "))
		require.NoError(t, err)
		s.rest = append(s.rest, c)
		c, err = net.Dial("tcp", grpcAddr)
		require.NoError(t, err)
		s.grpc = append(s.grpc, c)
	}
	for range conns {
		c, err := net.Dial("tcp", grpcAddr)
		require.NoError(t, err)
		s.streamConns = append(s.streamConns, c)
		openIdleStreams(t, c, streams)
		go s.countRefusals(c)
	}
	t.Cleanup(s.close)
	return s
}

func (s *slowClients) close() {
	for _, c := range append(append(s.rest, s.grpc...), s.streamConns...) {
		_ = c.Close()
	}
}

// openIdleStreams opens n CreateLease calls on c that never send their
// request message.
func openIdleStreams(t testing.TB, c net.Conn, n int) {
	_, err := c.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	fr := http2.NewFramer(c, c)
	require.NoError(t, fr.WriteSettings())
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"},
		{Name: ":path", Value: "/egressproxies.lease.v1.LeaseService/CreateLease"}, {Name: ":authority", Value: "broker"},
		{Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"}} {
		require.NoError(t, enc.WriteField(f))
	}
	for i := range n {
		require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndHeaders: true}))
	}
}

func (s *slowClients) countRefusals(c net.Conn) {
	fr := http2.NewFramer(io.Discard, c)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok && rst.ErrCode == http2.ErrCodeRefusedStream {
			s.mu.Lock()
			s.refused++
			s.mu.Unlock()
		}
	}
}

// closedByServer reports whether the server has closed c: a read
// returns EOF or a reset instead of timing out.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	var b [512]byte
	for {
		_, err := c.Read(b[:])
		var ne net.Error
		switch {
		case err == nil:
			continue // an answer (a 408), then the close
		case errors.As(err, &ne) && ne.Timeout():
			return false
		default:
			return true
		}
	}
}

// A thousand clients that take and never give (slowloris heads, silent
// gRPC connections, idle HTTP/2 streams) are open at once: leasing goes on
// over both APIs, each connection is cut at its limit, and streams past
// --grpc-max-concurrent-streams are refused. What they cost in latency is
// `make bench-broker`'s "with 1,000 slow clients open" line.
func TestSlowAndGreedyClientsCostNothingElse(t *testing.T) {
	f := newFleet(t)
	f.add("slow0", "127.0.0.97", nil)
	b := startBroker(t, f, proc.StartRedis(t, false), "--http-read-header-timeout", "2s", "--grpc-handshake-timeout", "2s",
		"--grpc-max-concurrent-streams", "8")
	slow := openSlowClients(t, b.REST[len("http://"):], b.GRPC, 450, 5, 20)

	c, err := leaseclient.Dial(b.GRPC)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 10 {
		l, err := c.Lease(ctx, leaseclient.Request{TTL: time.Minute})
		require.NoError(t, err, "a gRPC lease with the slow clients open")
		require.NoError(t, l.Release(ctx))
		r := b.Do("POST", "/v1/leases", `{"ttlSeconds":60}`)
		require.Equal(t, 200, r.Status, "a REST lease with the slow clients open: %s", r.Body)
	}

	require.Eventually(t, func() bool {
		for _, c := range append(slow.rest, slow.grpc...) {
			if !closedByServer(c) {
				return false
			}
		}
		return true
	}, 30*time.Second, 200*time.Millisecond, "every slow connection is cut at its timeout")
	require.Eventually(t, func() bool {
		slow.mu.Lock()
		defer slow.mu.Unlock()
		return slow.refused == 5*(20-8)
	}, 10*time.Second, 50*time.Millisecond, "streams past the limit are refused")
	for _, c := range slow.streamConns {
		assert.False(t, closedByServer(c), "a connection within its stream limit stays up")
	}
}
