package gateway

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

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
	kind string // "connect" or "http"
	// caller is who sent it, as authenticated when it arrived: every
	// call about its lease is made as them, its release and last report
	// even once their credential is removed (else the lease would hold
	// its proxy until its TTL).
	caller  access.Caller
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
	caller, err := g.callers.Gateway(pass)
	switch {
	case status.Code(err) == codes.Unauthenticated:
		g.answer(c, r.kind, needAuth("invalid proxy password"))
		return false
	case err != nil:
		g.answer(c, r.kind, refusal(err))
		return false
	}
	who := caller.Tenant
	r.caller = caller
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
			fmt.Sprintf("tenant %q holds its %d tunnels on this gateway (%s); close one or wait", who.Name, limit.N, limit.Source)), time.Second))
		return false
	}
	// A refusal frees the slot before it is answered: a client that
	// retries on the answer must find the slot free, not still held by
	// the request it was refused.
	held := true
	free := func() {
		if held {
			held = false
			g.freeSlot(who.Name)
		}
	}
	defer free()

	ctx, cancel := context.WithTimeout(context.Background(), g.o.TunnelTimeout)
	defer cancel()
	r.ctx = ctx
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
	g.renewer.hold(id, r.caller, func() { _ = c.Close() })
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
	now := g.o.Clock.Now()
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
