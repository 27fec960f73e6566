package probe_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

// hostile answers whatever is asked of it with one of these, until the
// reader gives up.
type hostile func(w interface{ Write([]byte) (int, error) })

var (
	// hugeStatus is a status line with no end.
	hugeStatus hostile = func(w interface{ Write([]byte) (int, error) }) {
		if _, err := w.Write([]byte("HTTP/1.1 200 ")); err != nil {
			return
		}
		chunk := bytes.Repeat([]byte("A"), 64<<10)
		for written := 0; written < 100<<20; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	// endlessHeaders sends header lines forever.
	endlessHeaders hostile = func(w interface{ Write([]byte) (int, error) }) {
		if _, err := w.Write([]byte("HTTP/1.1 200 OK\r\n")); err != nil {
			return
		}
		chunk := bytes.Repeat([]byte("X-Junk: junk\r\n"), 4096)
		for written := 0; written < 100<<20; written += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	// garish refuses with terminal escapes and newlines in its reason.
	garish hostile = func(w interface{ Write([]byte) (int, error) }) {
		_, _ = w.Write([]byte("HTTP/1.1 403 Forbidden \x1b[31m\x07no\r\n\r\n"))
	}
	// drip sends a status line a byte at a time, never finishing in time.
	drip hostile = func(w interface{ Write([]byte) (int, error) }) {
		for _, b := range []byte("HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Slow: yes\r\n", 1000)) {
			if _, err := w.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
)

// hostileProxy is a "proxy" on loopback that reads a request's head and
// answers with h.
func hostileProxy(t *testing.T, h hostile) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				buf := make([]byte, 4096)
				if _, err := c.Read(buf); err != nil {
					return
				}
				h(c)
			}()
		}
	}()
	return ln.Addr().String()
}

// hostileTarget is an HTTPS (or plain HTTP) target that answers through
// a real tunnel with h, and the pool that trusts it.
func hostileTarget(t *testing.T, h hostile, https bool) (string, *x509.CertPool) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer func() { _ = c.Close() }()
		h(c)
	}))
	if https {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	if https {
		pool.AddCert(srv.Certificate())
	}
	return srv.URL + "/", pool
}

// Whatever a proxy or a target answers, a probe costs its bounds: it
// fails in the right phase, with a reason that fits a Condition message,
// having allocated a few MiB at most of the 100 MiB thrown at it, and it
// ends by its timeout.
func TestAHostileAnswerCostsOneProbeAndAFewKiB(t *testing.T) {
	squid := proc.StartSquid(t, "127.0.0.1", false)
	type hostileCase struct {
		name    string
		proxy   string
		url     string
		pool    *x509.CertPool
		timeout time.Duration
		phase   probev1.ProbePhase
		reason  string
	}
	cases := []hostileCase{
		{name: "proxy answers CONNECT with a 100 MiB status line", proxy: hostileProxy(t, hugeStatus), url: "https://127.0.0.1:1/",
			phase: probev1.ProbePhase_PROBE_PHASE_CONNECT, reason: "status line and headers exceed 16 KiB"},
		{name: "proxy answers CONNECT with endless headers", proxy: hostileProxy(t, endlessHeaders), url: "https://127.0.0.1:1/",
			phase: probev1.ProbePhase_PROBE_PHASE_CONNECT, reason: "status line and headers exceed 16 KiB"},
		{name: "proxy refuses CONNECT with terminal escapes", proxy: hostileProxy(t, garish), url: "https://127.0.0.1:1/",
			phase: probev1.ProbePhase_PROBE_PHASE_CONNECT, reason: "403 Forbidden [31m no"},
		{name: "proxy drips its answer to CONNECT", proxy: hostileProxy(t, drip), url: "https://127.0.0.1:1/", timeout: time.Second,
			phase: probev1.ProbePhase_PROBE_PHASE_CONNECT, reason: "timed out"},
	}
	for _, h := range []struct {
		name   string
		h      hostile
		reason string
	}{
		{"a 100 MiB status line", hugeStatus, "status line and headers exceed 16 KiB"},
		{"endless headers", endlessHeaders, "status line and headers exceed 16 KiB"},
		{"a drip", drip, "timed out"},
	} {
		url, pool := hostileTarget(t, h.h, true)
		cases = append(cases, hostileCase{name: "target answers through a real Squid tunnel with " + h.name, proxy: squid.Addr, url: url, pool: pool, timeout: time.Second,
			phase: probev1.ProbePhase_PROBE_PHASE_HTTP, reason: h.reason})
		url, _ = hostileTarget(t, h.h, false)
		cases = append(cases, hostileCase{name: "target answers a plain request through a real Squid tunnel with " + h.name, proxy: squid.Addr, url: url, timeout: time.Second,
			phase: probev1.ProbePhase_PROBE_PHASE_HTTP, reason: h.reason})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = 10 * time.Second
			}
			p := &probe.Prober{RootCAs: tc.pool}
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			r := p.Do(context.Background(), tc.proxy, probe.Settings{URL: tc.url, ExpectedStatus: 200, Timeout: timeout})
			runtime.ReadMemStats(&after)
			assert.False(t, r.Success)
			assert.Equal(t, tc.phase, r.Phase, r.Reason)
			assert.Contains(t, r.Reason, tc.reason)
			assert.LessOrEqual(t, len(r.Reason), sanitize.MaxReason)
			assert.True(t, utf8.ValidString(r.Reason))
			assert.NotContains(t, r.Reason, "\x1b")
			// The count is the process's: it includes the hostile server's
			// own TLS writes (it runs in this process) and -race's
			// bookkeeping. Unbounded, it was hundreds of MiB.
			t.Logf("%s: %d KiB allocated, reason %q", r.Phase, (after.TotalAlloc-before.TotalAlloc)>>10, r.Reason)
			assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(4<<20), "the probe allocated %d KiB", (after.TotalAlloc-before.TotalAlloc)>>10)
		})
	}
}

// A proxy whose name resolves into the deny list is refused at dial, after
// resolution, before a byte is sent.
func TestADeniedProxyIsNeverDialed(t *testing.T) {
	accepted := make(chan struct{}, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- struct{}{}
			_ = c.Close()
		}
	}()
	deny, err := netpolicy.Parse("127.0.0.1/32,::1/128")
	require.NoError(t, err)
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	r := (&probe.Prober{Deny: deny}).Do(context.Background(), net.JoinHostPort("localhost", port),
		probe.Settings{URL: "https://127.0.0.1:1/", ExpectedStatus: 200, Timeout: time.Second})
	assert.False(t, r.Success)
	assert.Equal(t, probev1.ProbePhase_PROBE_PHASE_DIAL, r.Phase)
	assert.Contains(t, r.Reason, "is in the deny list")
	select {
	case <-accepted:
		t.Fatal("the denied address was dialed")
	case <-time.After(100 * time.Millisecond):
	}
}
