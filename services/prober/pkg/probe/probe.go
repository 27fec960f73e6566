// Package probe fetches a URL through an HTTP proxy and says whether, and
// where, it failed. It opens a real CONNECT tunnel to the address it
// resolved the target's name to and checked (never the name: the proxy
// would resolve it again, perhaps elsewhere), verifies an https target's
// certificate through it, and sends the request inside, Host and SNI
// naming the target. A proxy that accepts TCP but cannot egress fails at
// CONNECT.
package probe

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/probespec"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/sanitize"
)

// probeCurves leave out Go's default post-quantum hybrid key exchange
// (X25519MLKEM768): a probe carries no secret worth protecting for
// decades, and the hybrid share cost about a fifth of each probe's CPU, at
// the prober and at the target alike (bench-prober). X25519 is what every
// TLS 1.3 server takes; P-256 covers the rest.
var probeCurves = []tls.CurveID{tls.X25519, tls.CurveP256}

// Settings of one probe.
type Settings struct {
	URL            string
	ExpectedStatus int
	Timeout        time.Duration
	// EchoFormat is how the target echoes the caller's IP (see probespec).
	EchoFormat string
	// Credentials, unless empty, go to the proxy as Basic
	// Proxy-Authorization (on CONNECT, or on a plain http request).
	Credentials proxyauth.Credentials
}

// Result of one probe.
type Result struct {
	Success  bool
	Latency  time.Duration
	Phase    probev1.ProbePhase
	Reason   string
	EgressIP string
	// Bytes crossed the connection to the proxy, both ways.
	Bytes int64
}

// Prober runs probes; it is safe for concurrent use.
type Prober struct {
	// RootCAs verifies targets; nil means the system roots.
	RootCAs *x509.CertPool
	// MaxBody bounds how much of the answer's body is read; 0 means
	// DefaultMaxBody.
	MaxBody int64
	// Deny lists where no probe dials, checked on the address a proxy's
	// name resolves to.
	Deny netpolicy.DenyList
	// Egress is where a probe may send a proxy: a target's name is
	// resolved here and each address checked, so a health-check URL
	// naming an inside host is not fetched even through a proxy that
	// would take it there (a bought one, with no policy of its own).
	Egress netpolicy.Egress

	resolved sync.Map // host -> resolution
}

// resolution is a target name's check, kept for resolveTTL: every proxy
// probes the same few URLs, and a lookup per probe would cost more than
// the probe.
type resolution struct {
	addr    netip.Addr
	err     error
	expires time.Time
}

const resolveTTL = 30 * time.Second

// checkTarget resolves u's host and says why the probe must not send a
// proxy there, or which checked address to send it to: the proxy is
// given that address, not the name, so it cannot resolve the name anew
// to somewhere else (DNS rebinding). A name that does not resolve here
// is not probed.
func (p *Prober) checkTarget(ctx context.Context, u *url.URL) (netip.Addr, error) {
	host, port, connect := netpolicy.Destination(u)
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip, p.Egress.Check(ip, port, connect)
	}
	key := fmt.Sprintf("%s:%d:%t", host, port, connect)
	if r, ok := p.resolved.Load(key); ok && time.Now().Before(r.(resolution).expires) {
		return r.(resolution).addr, r.(resolution).err
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		// Not kept: the next probe asks again.
		return netip.Addr{}, fmt.Errorf("%s does not resolve here, so its address cannot be checked", host)
	}
	var denied error
	for _, ip := range ips {
		if denied = p.Egress.Check(ip, port, connect); denied != nil {
			denied = fmt.Errorf("%s resolves to %w", host, denied)
			break
		}
	}
	// IPv4 first where there is one: most proxies egress over it.
	addr := ips[0]
	if i := slices.IndexFunc(ips, func(ip netip.Addr) bool { return ip.Unmap().Is4() }); i >= 0 {
		addr = ips[i]
	}
	r := resolution{addr: addr.Unmap().WithZone(""), err: denied, expires: time.Now().Add(resolveTTL)}
	p.resolved.Store(key, r)
	return r.addr, r.err
}

// MaxHeaderBytes bounds the status line and headers of each answer a probe
// reads (the proxy's to CONNECT, the target's). Whoever answers a probe is
// untrusted: without a bound a 100 MiB status line costs the prober
// hundreds of MiB, and every other proxy it probes with it.
const MaxHeaderBytes = 16 << 10

// DefaultMaxBody bounds the body read: an echo of an address, or nothing.
const DefaultMaxBody = 64 << 10

// fail's reason may quote what the proxy or target said: it is bounded
// and cleaned here, where it is made, and again where it is written.
func fail(phase probev1.ProbePhase, start time.Time, format string, args ...any) Result {
	return Result{Phase: phase, Latency: time.Since(start), Reason: sanitize.Text(fmt.Sprintf(format, args...), sanitize.MaxReason)}
}

// budget reads at most n bytes from r; exhausted says whether an answer
// ran into the bound, so the reason can say so rather than "unexpected EOF".
type budget struct{ io.LimitedReader }

func newBudget(r io.Reader, n int64) *budget { return &budget{io.LimitedReader{R: r, N: n}} }
func (b *budget) exhausted() bool            { return b.N <= 0 }

// readFailure names why an answer could not be read. The HTTP parser
// reports a bound or a deadline hit mid-line as a malformed line; the
// reason says what really happened.
func readFailure(deadline time.Time, b *budget, err error) string {
	switch {
	case b.exhausted():
		return fmt.Sprintf("status line and headers exceed %d KiB", MaxHeaderBytes>>10)
	case !time.Now().Before(deadline):
		return "timed out"
	}
	return short(err)
}

// Do probes target through the proxy at proxyAddr ("host:port"). The
// result counts the bytes that crossed the connection to the proxy both
// ways, what a metered proxy bills.
func (p *Prober) Do(ctx context.Context, proxyAddr string, s Settings) Result {
	var n int64
	r := p.do(ctx, proxyAddr, s, &n)
	r.Bytes = n
	return r
}

// countingConn counts the bytes read and written into n. One probe's
// exchange runs on its own goroutine, so n needs no lock.
type countingConn struct {
	net.Conn
	n *int64
}

func (c countingConn) Read(b []byte) (int, error) {
	k, err := c.Conn.Read(b)
	*c.n += int64(k)
	return k, err
}

func (c countingConn) Write(b []byte) (int, error) {
	k, err := c.Conn.Write(b)
	*c.n += int64(k)
	return k, err
}

func (p *Prober) do(ctx context.Context, proxyAddr string, s Settings, n *int64) Result {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	u, err := url.Parse(s.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fail(probev1.ProbePhase_PROBE_PHASE_HTTP, start, "probe URL %q is not an absolute http(s) URL", s.URL)
	}
	addr, err := p.checkTarget(ctx, u)
	if err != nil {
		return fail(probev1.ProbePhase_PROBE_PHASE_DIAL, start, "probe URL %s is outside the egress policy: %s", u.Host, err)
	}
	_, port, _ := netpolicy.Destination(u)
	pinned := netip.AddrPortFrom(addr, port).String()
	d := net.Dialer{Control: p.Deny.Control}
	raw, err := d.DialContext(ctx, "tcp", proxyAddr)
	var denied *netpolicy.DeniedError
	switch {
	case errors.As(err, &denied):
		return fail(probev1.ProbePhase_PROBE_PHASE_DIAL, start, "proxy %s: %s", proxyAddr, denied)
	case err != nil:
		return fail(probev1.ProbePhase_PROBE_PHASE_DIAL, start, "dial %s: %s", proxyAddr, short(err))
	}
	conn := countingConn{Conn: raw, n: n}
	defer func() { _ = conn.Close() }()
	// One deadline for the whole exchange: a tunnel that never answers,
	// or answers a byte at a time, ends at the timeout, whatever phase it
	// is in.
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	maxBody := p.MaxBody
	if maxBody == 0 {
		maxBody = DefaultMaxBody
	}

	// The exchange the answer comes back on: the tunnel, or its TLS.
	req := p.request(ctx, u)
	connect := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: pinned}, Host: pinned, Header: http.Header{}}
	s.Credentials.Authorize(connect.Header)
	if err := connect.Write(conn); err != nil {
		return fail(probev1.ProbePhase_PROBE_PHASE_CONNECT, start, "sending CONNECT: %s", short(err))
	}
	head := newBudget(conn, MaxHeaderBytes)
	br := bufio.NewReader(head)
	cr, err := http.ReadResponse(br, connect)
	if err != nil {
		return fail(probev1.ProbePhase_PROBE_PHASE_CONNECT, start, "no answer to CONNECT %s: %s", pinned, readFailure(deadline, head, err))
	}
	_ = cr.Body.Close()
	if cr.StatusCode != http.StatusOK {
		return fail(probev1.ProbePhase_PROBE_PHASE_CONNECT, start, "proxy refused CONNECT %s: %s%s", pinned, cr.Status, squidCode(cr))
	}
	if br.Buffered() > 0 {
		return fail(probev1.ProbePhase_PROBE_PHASE_CONNECT, start, "proxy sent data before the tunnel opened")
	}
	var exchange io.ReadWriter = conn
	if u.Scheme == "https" {
		tc := tls.Client(conn, &tls.Config{ServerName: u.Hostname(), RootCAs: p.RootCAs, MinVersion: tls.VersionTLS12, CurvePreferences: probeCurves})
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(probev1.ProbePhase_PROBE_PHASE_TLS, start, "TLS with %s: %s", u.Hostname(), short(err))
		}
		exchange = tc
	}
	if err := req.Write(exchange); err != nil {
		return fail(probev1.ProbePhase_PROBE_PHASE_HTTP, start, "sending request: %s", short(err))
	}
	// The head gets its own budget; the body's is added once the head is
	// read, so "exceed" in a reason is exact.
	answer := newBudget(exchange, MaxHeaderBytes)
	resp, err := http.ReadResponse(bufio.NewReader(answer), req)
	if err != nil {
		return fail(probev1.ProbePhase_PROBE_PHASE_HTTP, start, "reading answer: %s", readFailure(deadline, answer, err))
	}
	answer.N += maxBody
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fail(probev1.ProbePhase_PROBE_PHASE_HTTP, start, "reading body: %s", short(err))
	}
	if resp.StatusCode != s.ExpectedStatus {
		return fail(probev1.ProbePhase_PROBE_PHASE_STATUS, start, "target answered %s, want %d", resp.Status, s.ExpectedStatus)
	}
	r := Result{Success: true, Latency: time.Since(start)}
	r.EgressIP = probespec.EchoedIP(s.EchoFormat, body)
	return r
}

// squidCode is the Squid error code a refusal carries, as " (ERR_...)".
func squidCode(resp *http.Response) string {
	if e := resp.Header.Get("X-Squid-Error"); e != "" {
		return " (" + e + ")"
	}
	return ""
}

func (p *Prober) request(ctx context.Context, u *url.URL) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	req.Header.Set("User-Agent", "egress-proxies-prober")
	req.Close = true
	return req
}

// short trims Go's wrapped network errors to their last part.
func short(err error) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timed out"
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 && i+2 < len(msg) {
		return msg[i+2:]
	}
	return msg
}
