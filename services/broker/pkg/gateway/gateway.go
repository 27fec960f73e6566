// Package gateway is the broker's HTTP proxy listener: any HTTP client
// (curl, requests, a headless browser) sets it as its proxy and gets the
// fleet, with its ban-aware leasing, without a line of code. Each CONNECT
// tunnel, and each plain-HTTP request, leases a proxy for its target host
// through the lease API in process (the same interceptors, the same Redis
// state as every other lease), goes through that proxy with its
// credentials, reports what it saw, and releases the lease when it ends.
//
// Options travel in the proxy user name, the API token in the password
// (docs/api.md, "The gateway"). Every destination is resolved here and
// checked against the egress policy before a lease is taken; the proxy
// is only ever given the checked address (a plain request rides a
// CONNECT tunnel to it), so a name that resolves differently at the proxy
// (DNS rebinding) cannot get round the check.
package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/faults"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// Leaser is the part of the lease API the gateway calls, in process;
// the servers' in-process LeaseService is one (checked below).
type Leaser interface {
	CreateLease(context.Context, *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error)
	ReleaseLease(context.Context, *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error)
	ReportLease(context.Context, *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error)
	RenewLease(context.Context, *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error)
}

var _ Leaser = leasev1.LeaseServiceServer(nil)

// Gateway serves the proxy listeners.
type Gateway struct {
	o      Options
	log    *slog.Logger
	leaser Leaser
	auth   auth.Verifier
	ln     net.Listener
	tlsLn  net.Listener // nil without Options.TLSAddr

	// perTenant counts each tenant's tunnels and requests in flight.
	perTenant sync.Map // name -> *atomic.Int64
	mu        sync.Mutex
	conns     map[net.Conn]*tunnel // open client connections; the tunnel once spliced
	// perSource counts the open connections from each address.
	perSource map[netip.Addr]int
	closing   bool
	wg        sync.WaitGroup
	renewer   renewer
}

// ErrOpenProxy is the refusal to serve without a token.
var ErrOpenProxy = errors.New("--gateway-addr needs --token-file or --tenant-namespace: without credentials the gateway would be an open proxy")

// New binds the listener; v says whose each proxy password is. The
// gateway refuses to run without credentials: it would be an open proxy
// into the fleet.
func New(log *slog.Logger, o Options, l Leaser, v auth.Verifier) (*Gateway, error) {
	if !v.Enabled() {
		return nil, ErrOpenProxy
	}
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.TLSAddr != "" && o.TLS == nil {
		return nil, ErrNoCertificate
	}
	o.Resolver = o.resolver()
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	// A tunnel holds two descriptors: a bound past the process's limit
	// would have accept fail first, on the lease API's ports too.
	var nofile syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &nofile); err == nil && o.MaxConns > 0 && uint64(2*o.MaxConns+1024) > nofile.Cur {
		log.Warn("--gateway-max-conns is above what the process's descriptor limit holds (two per tunnel, and room for the rest)", "maxConns", o.MaxConns, "nofile", nofile.Cur)
	}
	g := &Gateway{o: o, log: log, leaser: l, auth: v, conns: map[net.Conn]*tunnel{}, perSource: map[netip.Addr]int{}, renewer: renewer{clock: o.Clock}}
	var err error
	if g.ln, err = net.Listen("tcp", o.Addr); err != nil {
		return nil, fmt.Errorf("--gateway-addr %s: %w", o.Addr, err)
	}
	if o.TLSAddr != "" {
		if g.tlsLn, err = net.Listen("tcp", o.TLSAddr); err != nil {
			_ = g.ln.Close()
			return nil, fmt.Errorf("--gateway-tls-addr %s: %w", o.TLSAddr, err)
		}
	}
	return g, nil
}

// Addr is the plaintext listener's address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// TLSAddr is the TLS listener's address, "" without one.
func (g *Gateway) TLSAddr() string {
	if g.tlsLn == nil {
		return ""
	}
	return g.tlsLn.Addr().String()
}

// Serve accepts clients until ctx ends, then closes every connection and
// returns once each one's lease is released.
func (g *Gateway) Serve(ctx context.Context) error {
	stop := context.AfterFunc(ctx, g.shutdown)
	defer stop()
	go g.renewer.run(ctx, g.leaser, g.o.LeaseTTL)
	errc := make(chan error, 2)
	go func() { errc <- g.accept(g.ln, nil) }()
	n := 1
	if g.tlsLn != nil {
		n++
		go func() { errc <- g.accept(g.tlsLn, g.o.TLS) }()
	}
	var err error
	for range n {
		err = errors.Join(err, <-errc)
	}
	g.shutdown()
	g.wg.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// accept serves ln's clients (over TLS with cfg, if set) until it closes.
func (g *Gateway) accept(ln net.Listener, cfg *tls.Config) error {
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return nil
		}
		if err != nil {
			// Out of descriptors (EMFILE) or memory: clients wait in the
			// backlog until a tunnel ends, as net/http's server does.
			g.log.Error("gateway accept failed; retrying", "err", err, "in", backoff)
			time.Sleep(backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		a, ok := g.track(c)
		switch {
		case ok:
			go g.serve(c, cfg)
		case a.code != 0:
			// Refused at once, from this goroutine: the answer fits in a
			// new socket's send buffer, and nothing of the client is read.
			g.refuse(c, cfg, a)
		default:
			_ = c.Close()
			return nil // closing
		}
	}
}

// track counts c in, or says why not: the gateway is at its bound, or
// c's source at its own (a zero answer: the gateway is closing).
func (g *Gateway) track(c net.Conn) (answer, bool) {
	src := sourceOf(c)
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case g.closing:
		return answer{}, false
	case g.o.MaxConns > 0 && len(g.conns) >= g.o.MaxConns:
		connsRefused.WithLabelValues("gateway").Inc()
		return withRetryAfter(deny("GATEWAY_BUSY", fmt.Sprintf("the gateway holds its %d connections (--gateway-max-conns); retry, or use another broker", g.o.MaxConns)), time.Second), false
	case g.o.MaxConnsPerSource > 0 && g.perSource[src] >= g.o.MaxConnsPerSource:
		connsRefused.WithLabelValues("source").Inc()
		return withRetryAfter(deny("SOURCE_CONN_CAP", fmt.Sprintf("your address holds its %d connections to this gateway (--gateway-max-conns-per-source); close some, or reuse them (keep-alive)", g.o.MaxConnsPerSource)), time.Second), false
	}
	g.conns[c] = nil
	g.perSource[src]++
	connsOpen.Inc()
	g.wg.Add(1)
	return answer{}, true
}

func (g *Gateway) untrack(c net.Conn) {
	src := sourceOf(c)
	g.mu.Lock()
	delete(g.conns, c)
	if g.perSource[src]--; g.perSource[src] <= 0 {
		delete(g.perSource, src)
	}
	g.mu.Unlock()
	connsOpen.Dec()
	_ = c.Close()
	g.wg.Done()
}

// refuse answers a connection the gateway will not serve, and closes it.
// Over TLS the answer would need a handshake first: it is closed.
func (g *Gateway) refuse(c net.Conn, cfg *tls.Config, a answer) {
	if cfg == nil {
		requests.WithLabelValues("unread", strconv.Itoa(a.code)).Inc()
		_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
		_ = a.write(c)
	}
	_ = c.Close()
}

// sourceOf is the address c comes from.
func sourceOf(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	}
	return netip.Addr{}
}

// shutdown stops accepting and closes every connection: tunnels end, and
// their handlers release their leases.
func (g *Gateway) shutdown() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return
	}
	g.closing = true
	_ = g.ln.Close()
	if g.tlsLn != nil {
		_ = g.tlsLn.Close()
	}
	for c, t := range g.conns {
		if t != nil {
			t.shut("shutdown")
		} else {
			_ = c.Close()
		}
	}
}

// headLimit bounds the bytes a request's head may take from the client.
type headLimit struct {
	r io.Reader
	n int // < 0: unbounded (a body)
}

func (h *headLimit) Read(p []byte) (int, error) {
	if h.n < 0 {
		return h.r.Read(p)
	}
	if h.n == 0 {
		return 0, errHeadTooLarge
	}
	n, err := h.r.Read(p[:min(len(p), h.n)])
	h.n -= n
	return n, err
}

var errHeadTooLarge = errors.New("request head too large")

// serve reads requests off one client connection until it closes, a
// request turns it into a tunnel, or an answer ends it.
func (g *Gateway) serve(c net.Conn, cfg *tls.Config) {
	defer func() { g.untrack(c) }()
	// Until its first byte a connection holds its goroutine and nothing
	// else: no buffer for a client that only connects.
	_ = c.SetReadDeadline(time.Now().Add(g.o.HeaderTimeout))
	if err := waitReadable(c); err != nil {
		if cfg == nil {
			g.badRequest(c, err)
		}
		return
	}
	if cfg != nil {
		tc := tls.Server(c, cfg)
		if err := tc.Handshake(); err != nil {
			tlsFailed.Inc()
			return
		}
		// From here the gateway knows the connection as tc: a shutdown
		// closes it, and a tunnel is recorded under it.
		g.mu.Lock()
		delete(g.conns, c)
		g.conns[tc] = nil
		g.mu.Unlock()
		c = tc
	}
	limit := &headLimit{r: c}
	br := bufio.NewReader(limit)
	for first := true; ; first = false {
		if !first {
			// Between requests a keep-alive client may wait an idle
			// timeout; once it starts, its head is due within the header
			// timeout.
			_ = c.SetReadDeadline(time.Now().Add(g.o.IdleTimeout))
			if _, err := br.Peek(1); err != nil {
				return
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(g.o.HeaderTimeout))
		limit.n = g.o.MaxHeaderBytes
		req, err := http.ReadRequest(br)
		if err != nil {
			g.badRequest(c, err)
			return
		}
		limit.n = -1
		_ = c.SetReadDeadline(time.Time{})
		if !g.handle(c, br, req) {
			return
		}
	}
}

// badRequest answers a request that could not be read, if there was one.
func (g *Gateway) badRequest(c net.Conn, err error) {
	var ne net.Error
	a := deny("BAD_REQUEST", "malformed request line or header")
	switch {
	case errors.Is(err, io.EOF):
		return // the client left
	case errors.Is(err, errHeadTooLarge):
		a = deny("HEAD_TOO_LARGE", fmt.Sprintf("the request's head is over %d bytes", g.o.MaxHeaderBytes))
	case errors.As(err, &ne) && ne.Timeout():
		a = deny("HEAD_TIMEOUT", fmt.Sprintf("the request's head did not arrive within %s", g.o.HeaderTimeout))
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return
	}
	g.answer(c, "unread", a)
}

// answer writes a, counted under kind.
func (g *Gateway) answer(c net.Conn, kind string, a answer) {
	requests.WithLabelValues(kind, strconv.Itoa(a.code)).Inc()
	_ = c.SetWriteDeadline(time.Now().Add(g.o.HeaderTimeout))
	_ = a.write(c)
}

// request is one CONNECT or plain-HTTP request, authenticated.
type request struct {
	kind   string // "connect" or "http"
	caller string
	// tenant is the caller's, as verified when the request arrived.
	tenant  context.Context
	ctx     context.Context
	host    string
	port    uint16
	addrs   []netip.Addr // the checked addresses, as resolved
	addr    netip.Addr   // the first, where a plain request goes
	opts    userOptions
	started time.Time
	// bytes counts what it carries against its tenant's day; nil when
	// the tenant has no byte quota.
	bytes *byteMeter
}

// handle serves one request; it says whether the connection may carry
// another.
func (g *Gateway) handle(c net.Conn, br *bufio.Reader, req *http.Request) bool {
	r := &request{kind: "http", started: time.Now()}
	if req.Method == http.MethodConnect {
		r.kind = "connect"
	}
	user, pass, ok := proxyBasicAuth(req)
	if !ok {
		g.answer(c, r.kind, needAuth("no proxy credentials"))
		return false
	}
	tctx, err := g.auth.Verify(auth.ViaGateway(context.Background()), access.GatewayMethod, pass)
	switch {
	case status.Code(err) == codes.Unauthenticated:
		g.answer(c, r.kind, needAuth("invalid proxy password"))
		return false
	case err != nil:
		g.answer(c, r.kind, refusal(err))
		return false
	}
	who := access.From(tctx)
	r.caller, r.tenant = who.Name, tctx
	if r.opts, err = parseUser(user); err != nil {
		g.answer(c, r.kind, deny("BAD_OPTIONS", err.Error()))
		return false
	}
	if err := r.destination(req); err != nil {
		g.answer(c, r.kind, deny("BAD_DESTINATION", err.Error()))
		return false
	}
	if a, ok := g.withinBytes(who); !ok {
		g.answer(c, r.kind, a)
		return false
	}
	r.bytes = g.byteMeter(who)
	defer r.bytes.flush()
	if limit, ok := g.takeSlot(who); !ok {
		g.answer(c, r.kind, withRetryAfter(deny("TOKEN_TUNNEL_CAP",
			fmt.Sprintf("tenant %q holds its %d tunnels on this gateway (%s); close one or wait", r.caller, limit.N, limit.Source)), time.Second))
		return false
	}
	// A refusal frees the slot before it is answered: a client that
	// retries on the answer must find the slot free, not still held by
	// the request it was refused.
	held := true
	free := func() {
		if held {
			held = false
			g.freeSlot(r.caller)
		}
	}
	defer free()

	ctx, cancel := context.WithTimeout(auth.ViaGateway(context.Background()), g.o.TunnelTimeout)
	defer cancel()
	// The lease API authenticates the call again and counts it under the
	// token's name, as it does every gRPC and REST call.
	r.ctx = leases.Observed(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+pass)))
	if a, ok := g.check(r); !ok {
		free()
		g.answer(c, r.kind, a)
		return false
	}
	h, t, a := g.through(r, req, c)
	if a != nil {
		free()
		g.answer(c, r.kind, *a)
		return false
	}
	id := t.lease.GetLeaseId()
	md, _ := metadata.FromIncomingContext(r.ctx)
	g.renewer.hold(id, md, func() { _ = c.Close() })
	defer g.renewer.drop(id)
	if r.kind == "connect" {
		defer g.release(r, id)
		g.splice(c, br, r, t, h)
		return false
	}
	more, res, code := g.relay(c, req, r, t, h)
	// The answer is out: an ok report and the release need not hold up
	// the connection's next request. Any other report lands first, so the
	// next lease for the site already sees what this one earned.
	if res != faults.OK {
		g.report(r, id, res, code)
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		if res == faults.OK {
			g.report(r, id, res, code)
		}
		g.release(r, id)
	}()
	return more
}

// proxyBasicAuth reads Proxy-Authorization: Basic.
func proxyBasicAuth(req *http.Request) (user, pass string, ok bool) {
	h := req.Header.Get("Proxy-Authorization")
	if h == "" {
		return "", "", false
	}
	// http.Request.BasicAuth reads Authorization; borrow it.
	r := http.Request{Header: http.Header{"Authorization": {h}}}
	return r.BasicAuth()
}

// destination reads where the request goes: CONNECT host:port, or an
// absolute http:// URI.
func (r *request) destination(req *http.Request) error {
	var hostport string
	switch {
	case r.kind == "connect":
		hostport = req.Host
		if _, _, err := net.SplitHostPort(hostport); err != nil {
			return fmt.Errorf("CONNECT %q: give host:port", clip(hostport))
		}
	case req.URL.Scheme == "http" && req.URL.Host != "":
		hostport = req.URL.Host
		if req.URL.Port() == "" {
			hostport = net.JoinHostPort(req.URL.Hostname(), "80")
		}
	case req.URL.Scheme == "https":
		return errors.New("https:// URLs go through a CONNECT tunnel (set the gateway as HTTPS_PROXY)")
	default:
		return fmt.Errorf("%s %q: this is a proxy; send an absolute http:// URI or CONNECT host:port", req.Method, clip(req.RequestURI))
	}
	host, port, _ := net.SplitHostPort(hostport)
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 || host == "" {
		return fmt.Errorf("destination %q: give host:port with a port 1-65535", clip(hostport))
	}
	r.host, r.port = strings.ToLower(strings.TrimSuffix(host, ".")), uint16(p)
	return nil
}

// check resolves the destination and holds every address it has to the
// egress policy; the first is the one a CONNECT goes to.
func (g *Gateway) check(r *request) (answer, bool) {
	connect := r.kind == "connect"
	addrs := []netip.Addr(nil)
	if ip, err := netip.ParseAddr(r.host); err == nil {
		addrs = []netip.Addr{ip}
	} else {
		ctx, cancel := context.WithTimeout(r.ctx, g.o.DialTimeout)
		defer cancel()
		if addrs, err = g.o.Resolver.LookupNetIP(ctx, "ip", r.host); err != nil || len(addrs) == 0 {
			return deny("UNRESOLVED", fmt.Sprintf("%s does not resolve; no proxy was leased", r.host)), false
		}
	}
	for _, ip := range addrs {
		var denied *netpolicy.DeniedError
		if err := g.o.Egress.Check(ip, r.port, connect); errors.As(err, &denied) {
			why := "it is not a public address"
			if denied.Why != "" {
				why = denied.Why // about the port
			}
			egressDenied.Inc()
			// The address is not quoted: it may be inside.
			return deny("EGRESS_DENIED", fmt.Sprintf("%s:%d is outside the egress policy: %s", r.host, r.port, why)), false
		}
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap().WithZone("")
	}
	r.addrs, r.addr = addrs, addrs[0]
	return answer{}, true
}

// maxAddrs bounds the addresses a CONNECT tries: each costs a round
// trip through the proxy.
const maxAddrs = 4

// tryOrder is the addresses a CONNECT tries, families alternating from
// the first (RFC 8305's interleaving), at most maxAddrs.
func (r *request) tryOrder() []netip.Addr {
	var same, other []netip.Addr
	for _, a := range r.addrs {
		if a.Is4() == r.addrs[0].Is4() {
			same = append(same, a)
		} else {
			other = append(other, a)
		}
	}
	var out []netip.Addr
	for i := 0; len(out) < maxAddrs && (i < len(same) || i < len(other)); i++ {
		if i < len(same) {
			out = append(out, same[i])
		}
		if i < len(other) && len(out) < maxAddrs {
			out = append(out, other[i])
		}
	}
	return out
}

// afterwards is a context for a call about r's lease once r's own may
// have ended (the tunnel outlived its deadline, the client left): r's
// tenant as verified when r arrived, so its lease is released and its
// last outcome reported even once its credential is removed, and a bound
// of its own. Renewals verify the credential again (renew.go).
func (r *request) afterwards() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(auth.Verified(r.tenant), 10*time.Second)
	return leases.Observed(ctx), cancel
}

// release ends the lease, whatever happened to the client.
func (g *Gateway) release(r *request, id string) {
	ctx, cancel := r.afterwards()
	defer cancel()
	if _, err := g.leaser.ReleaseLease(ctx, &leasev1.ReleaseLeaseRequest{LeaseId: id}); err != nil {
		// It expires at its TTL, the tunnel timeout.
		releaseFailed.Inc()
		g.log.Warn("gateway could not release a lease; it expires at its TTL", "token", r.caller, "lease", id, "err", err)
	}
}

// report tells the broker how the target treated the leased proxy, or
// (faults.Error) that the proxy itself failed.
func (g *Gateway) report(r *request, id string, o faults.Result, statusCode int) {
	outcomes.WithLabelValues(r.kind, string(o)).Inc()
	ctx, cancel := r.afterwards()
	defer cancel()
	latency := min(time.Since(r.started).Milliseconds(), 3_600_000)
	if _, err := g.leaser.ReportLease(ctx, &leasev1.ReportLeaseRequest{LeaseId: id, Target: r.host, Result: string(o), StatusCode: int32(statusCode), LatencyMs: int32(latency)}); err != nil {
		reportFailed.Inc()
		g.log.Debug("gateway report failed", "token", r.caller, "lease", id, "err", err)
	}
}

// dial connects to the leased proxy.
func (g *Gateway) dial(r *request, lease *leasev1.CreateLeaseResponse) (net.Conn, error) {
	d := net.Dialer{Timeout: g.o.DialTimeout}
	return d.DialContext(r.ctx, "tcp", net.JoinHostPort(lease.GetProxy().GetIp(), strconv.Itoa(int(lease.GetProxy().GetPort()))))
}

// credentials are the leased proxy's Proxy-Authorization, if it has any.
func credentials(lease *leasev1.CreateLeaseResponse) proxyauth.Credentials {
	c := lease.GetCredentials()
	return proxyauth.Credentials{Username: c.GetUsername(), Password: c.GetPassword()}
}

// splice answers the client's CONNECT, naming the lease, and splices
// the client into the tunnel the leased proxy opened.
func (g *Gateway) splice(c net.Conn, br *bufio.Reader, r *request, t *try, h hop) {
	up := h.up
	requests.WithLabelValues(r.kind, "200").Inc()
	head := append([]byte("HTTP/1.1 200 Connection established\r\n"), t.headerLines()...)
	if _, err := c.Write(append(head, "\r\n"...)); err != nil {
		_ = up.Close()
		return
	}
	// Bytes either side sent early (a ClientHello pipelined behind the
	// CONNECT) go first; then the bufio readers are dropped and the
	// connections spliced.
	if err := flush(up, br); err != nil {
		_ = up.Close()
		return
	}
	if err := flush(c, h.ubr); err != nil {
		_ = up.Close()
		return
	}
	tn := &tunnel{client: c, up: up, idle: g.o.IdleTimeout, deadline: r.started.Add(g.o.TunnelTimeout), bytes: r.bytes}
	if !g.spliced(c, tn) {
		tn.shut("shutdown")
		return
	}
	tunnelsOpen.Inc()
	sent, received, clean := tn.run()
	tunnelsOpen.Dec()
	tunnelBytes.WithLabelValues("sent").Add(float64(sent))
	tunnelBytes.WithLabelValues("received").Add(float64(received))
	who := access.Label(r.caller)
	access.GatewayBytes.WithLabelValues(who, "sent").Add(float64(sent))
	access.GatewayBytes.WithLabelValues(who, "received").Add(float64(received))
	if received > 0 && clean {
		g.report(r, t.lease.GetLeaseId(), faults.OK, 0)
	}
}

// proxyDenied is the answer when the leased proxy's own egress policy
// refused the destination: not the proxy's fault, so nothing is
// reported against it.
func proxyDenied(r *request) answer {
	return deny("PROXY_DENIED", fmt.Sprintf("the leased proxy refused %s:%d (its egress policy); it is not blamed", r.host, r.port))
}

// spliced records c's tunnel, so a shutdown cuts it; false when the
// gateway is already closing.
func (g *Gateway) spliced(c net.Conn, t *tunnel) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	g.conns[c] = t
	return true
}

// flush writes what br holds to w.
func flush(w io.Writer, br *bufio.Reader) error {
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		_, err := w.Write(b)
		return err
	}
	return nil
}

// relay passes the site's answer to a plain-HTTP request back, naming
// the lease. It says whether the client connection may carry another
// request, and what to report: the answer as the fault table judges it.
func (g *Gateway) relay(c net.Conn, req *http.Request, r *request, t *try, h hop) (bool, faults.Result, int) {
	resp := h.resp
	defer func() { _ = h.up.Close(); _ = resp.Body.Close() }()
	c = metered{Conn: bounded{Conn: c, idle: g.o.IdleTimeout, deadline: r.started.Add(g.o.TunnelTimeout)}, bytes: r.bytes}
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	var body io.Reader = resp.Body
	if resp.Header.Get("X-Squid-Error") != "" && resp.StatusCode >= 400 {
		// An error page, Squid's or a site's dressed as it: judged as any
		// answer (its code is not trusted here), and replaced by the
		// gateway's, since Squid's own names the proxy's host.
		head, _ := io.ReadAll(io.LimitReader(resp.Body, int64(faults.MarkerWindow())))
		res := faults.Response(resp.StatusCode, resp.Header, head)
		if a, ok := errorPage(r, resp.StatusCode, res); ok {
			t.tag(&a)
			g.answer(c, r.kind, a)
			return false, res, resp.StatusCode
		}
		body = io.MultiReader(bytes.NewReader(head), resp.Body)
	}
	keepAlive := !req.Close && !h.unread
	removeHopByHop(resp.Header)
	for _, name := range []string{"Via", "X-Cache", "X-Cache-Lookup"} {
		resp.Header.Del(name) // they name the proxy's host
	}
	t.setHeaders(resp.Header)
	sniffed := &sniffer{body: readCloser{body, resp.Body}}
	resp.Body = sniffed
	resp.Close = !keepAlive
	err := resp.Write(c)
	requests.WithLabelValues(r.kind, strconv.Itoa(resp.StatusCode)).Inc()
	return err == nil && keepAlive && !resp.Close, faults.Response(resp.StatusCode, resp.Header, sniffed.head), resp.StatusCode
}

// hopByHop are the headers one connection's ends use, never forwarded.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// withinBytes says whether t's tunnels may carry more today, or the
// answer refusing one: its gatewayBytesPerDay is reached, until the
// next UTC midnight. A store that cannot say lets the tunnel through:
// leasing fails then anyway, and says why.
func (g *Gateway) withinBytes(t *access.Tenant) (answer, bool) {
	quota := t.Quotas.GatewayBytesPerDay
	if quota <= 0 || g.o.Meter == nil {
		return answer{}, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.o.DialTimeout)
	defer cancel()
	now := time.Now()
	used, err := g.o.Meter.TenantBytes(ctx, t.Name, now)
	if err != nil || used < quota {
		return answer{}, true
	}
	midnight := now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	return withRetryAfter(deny("TENANT_BYTES_QUOTA", fmt.Sprintf("tenant %q carried %d bytes through the gateway today, its quota (its Tenant's spec.quotas.gatewayBytesPerDay %d); it renews at 00:00 UTC",
		t.Name, used, quota)), midnight.Sub(now)), false
}

// takeSlot counts a tunnel against its tenant's limit: its Tenant's
// maxTunnels, else the flag's; it says which when the limit is reached.
func (g *Gateway) takeSlot(t *access.Tenant) (access.Limit, bool) {
	limit := access.LimitOf(t.Quotas.MaxTunnels, "maxTunnels", g.o.TokenMaxTunnels, "--gateway-token-max-tunnels")
	v, ok := g.perTenant.Load(t.Name)
	if !ok {
		v, _ = g.perTenant.LoadOrStore(t.Name, new(atomic.Int64))
	}
	if n := v.(*atomic.Int64).Add(1); limit.N > 0 && n > int64(limit.N) {
		v.(*atomic.Int64).Add(-1)
		tokenCapped.WithLabelValues(t.Name).Inc()
		return limit, false
	}
	access.Tunnels.WithLabelValues(access.Label(t.Name)).Inc()
	return limit, true
}

func (g *Gateway) freeSlot(caller string) {
	if v, ok := g.perTenant.Load(caller); ok {
		v.(*atomic.Int64).Add(-1)
		access.Tunnels.WithLabelValues(access.Label(caller)).Dec()
	}
}

// readCloser reads r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }
