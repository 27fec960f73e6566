package gateway

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// try is one lease a request went through, and how many proxies the
// request has tried with it.
type try struct {
	lease *leasev1.CreateLeaseResponse
	n     int
}

// The headers naming what served a request (docs/api.md, "Whose fault"):
// on every tunnel's 200, every plain-HTTP answer and every refusal
// after a lease was taken, so a client can report by lease id what it
// sees inside TLS and tell one proxy from another.
const (
	hdrLease    = "X-Egress-Proxies-Lease"
	hdrProxy    = "X-Egress-Proxies-Proxy"
	hdrExitIP   = "X-Egress-Proxies-Exit-IP"
	hdrAttempts = "X-Egress-Proxies-Attempts"
)

func (t *try) setHeaders(h http.Header) {
	h.Set(hdrLease, t.lease.GetLeaseId())
	h.Set(hdrProxy, t.lease.GetProxy().GetId())
	if ip := t.lease.GetProxy().GetEgressIp(); ip != "" {
		h.Set(hdrExitIP, ip)
	}
	h.Set(hdrAttempts, strconv.Itoa(t.n))
}

// headerLines are setHeaders' as lines of a response head.
func (t *try) headerLines() []byte {
	h := http.Header{}
	t.setHeaders(h)
	var b strings.Builder
	_ = h.Write(&b)
	return []byte(b.String())
}

// tag names t on a.
func (t *try) tag(a *answer) {
	if a.header == nil {
		a.header = http.Header{}
	}
	t.setHeaders(a.header)
}

// hop is a leased proxy that took the request: the tunnel it opened
// (and any bytes it sent past its answer), or its answer to a plain
// request.
type hop struct {
	up   net.Conn
	ubr  *bufio.Reader
	head *headLimit // under ubr
	resp *http.Response
	// unread: the plain request's body was not all sent (the site
	// answered first), so its client connection cannot carry another.
	unread bool
}

// through leases a proxy for r and has it take the request. While the
// leased proxy fails on its own hop before any byte reached the client
// (no answer, a refused dial or credentials, an error of its own), the
// failure is reported against it and another proxy is leased, at most
// Retries more times; a session whose proxy failed moves with it. A
// non-nil answer is the client's refusal, to be written once every lease
// it took is released.
func (g *Gateway) through(r *request, req *http.Request, c net.Conn) (hop, *try, *answer) {
	// Leases of proxies that failed are held until another proxy took the
	// request: a held lease is load, so the retry's least-loaded pick
	// passes over them.
	var failed []string
	defer func() {
		for _, id := range failed {
			g.release(r, id)
		}
	}()
	tried := map[string]bool{}
	var last *answer
	// Each proxy tried costs an attempt; a pick that comes back to one
	// that failed costs only a lease (held, it weighs on the next pick),
	// within a budget of two per attempt.
	for n, leased := 1, 0; n <= 1+g.o.Retries && leased < 2*(1+g.o.Retries); leased++ {
		lease, err := g.lease(r, last == nil)
		if err != nil {
			if last != nil {
				// No other proxy qualifies now: what the client needs to
				// hear is that its proxies failed.
				return hop{}, nil, last
			}
			a := refusal(err)
			if a.code >= 500 && a.reason == "INTERNAL" {
				g.log.Warn("gateway could not lease", "token", r.caller, "target", r.host, "err", err)
			}
			return hop{}, nil, &a
		}
		t := &try{lease: lease, n: n}
		if tried[lease.GetProxy().GetId()] {
			failed = append(failed, lease.GetLeaseId())
			continue
		}
		tried[lease.GetProxy().GetId()] = true
		if n > 1 {
			retries.Inc()
		}
		var h hop
		var a answer
		var ok bool
		if r.kind == "connect" {
			h, a, ok = g.open(r, t)
		} else {
			h, a, ok = g.send(r, req, t, c)
		}
		if ok {
			return h, t, nil
		}
		t.tag(&a)
		if a.fault != faults.Proxy {
			g.release(r, lease.GetLeaseId())
			return hop{}, nil, &a
		}
		failed = append(failed, lease.GetLeaseId())
		last = &a
		n++
	}
	return hop{}, nil, last
}

// lease leases a proxy for r. A refusal for want of a free lease slot
// (every matching proxy at its lease cap, the target or the token at
// theirs) is waited out for up to CapacityWait when wait is set: the
// slot a client's last tunnel held is freed a moment after the client
// moved on to its next, so a busy fleet refuses nothing it could serve a
// few milliseconds later.
func (g *Gateway) lease(r *request, wait bool) (*leasev1.CreateLeaseResponse, error) {
	req := &leasev1.CreateLeaseRequest{Namespace: r.opts.namespace, Selector: r.opts.selector,
		Target: r.host, SessionKey: r.opts.session, TtlSeconds: int32(g.o.LeaseTTL.Seconds())}
	deadline := time.Now().Add(g.o.CapacityWait)
	pause := 2 * time.Millisecond
	waited := false
	for {
		lease, err := g.leaser.CreateLease(r.ctx, req)
		if err == nil || !wait || !slotWait[refusal(err).reason] || !time.Now().Add(pause).Before(deadline) {
			if waited {
				capacityWaits.WithLabelValues(map[bool]string{true: "leased", false: "refused"}[err == nil]).Inc()
			}
			return lease, err
		}
		waited = true
		select {
		case <-time.After(pause):
		case <-r.ctx.Done():
			return nil, r.ctx.Err()
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// slotWait are the refusals a lease slot freeing cures.
var slotWait = map[string]bool{"ALL_AT_CAP": true, "ALL_COOLING_DOWN_OR_AT_CAP": true, "TARGET_AT_CAP": true, "TOKEN_LEASE_CAP": true}

// open has t's proxy open a tunnel to the checked addresses, one after
// another while the proxy says it could not reach one (a site with an
// IPv6 address first, through a proxy with no IPv6 egress). Its answer
// to CONNECT is its own (a site never sees the CONNECT), so the fault
// table's verdict on it is sound: the proxy's own failure is reported
// against it, a site it could not reach at any address is the site's,
// and its egress policy's refusal is nobody's.
func (g *Gateway) open(r *request, t *try) (hop, answer, bool) {
	id := t.lease.GetLeaseId()
	addrs := r.tryOrder()
	for i, addr := range addrs {
		h, resp, a, ok := g.connect(r, t, addr)
		if ok || resp == nil {
			return h, a, ok
		}
		class := faults.Connect(resp.StatusCode, resp.Header)
		if class == faults.Site && i < len(addrs)-1 {
			continue
		}
		if class == faults.Caller {
			return hop{}, proxyDenied(r), false
		}
		g.report(r, id, faults.ResultOf(class), resp.StatusCode)
		if class == faults.Site {
			return hop{}, siteFailed(r, resp), false
		}
		return hop{}, deny("PROXY_FAILED", fmt.Sprintf("the leased proxy refused the tunnel itself (%d %s); no other proxy could take the request",
			resp.StatusCode, clip(faults.SquidCode(resp.Header)))), false
	}
	panic("gateway: a checked destination with no address")
}

// connect has t's proxy open a tunnel to addr: the tunnel, or the
// proxy's answer when it would not (resp), or the failure of the proxy's
// own hop, reported (no resp).
func (g *Gateway) connect(r *request, t *try, addr netip.Addr) (hop, *http.Response, answer, bool) {
	id := t.lease.GetLeaseId()
	up, err := g.dial(r, t.lease)
	if err != nil {
		g.report(r, id, faults.Error, 0)
		return hop{}, nil, deny("PROXY_UNREACHABLE", "the leased proxy did not answer; no other proxy could take the request"), false
	}
	target := net.JoinHostPort(addr.String(), strconv.Itoa(int(r.port)))
	creq := &http.Request{Method: http.MethodConnect, URL: &neturl.URL{Opaque: target}, Host: target, Header: http.Header{}}
	credentials(t.lease).Authorize(creq.Header)
	_ = up.SetDeadline(time.Now().Add(g.o.DialTimeout))
	head := &headLimit{r: up, n: g.o.MaxHeaderBytes}
	ubr := bufio.NewReaderSize(head, 1024)
	var resp *http.Response
	if err = creq.Write(up); err == nil {
		resp, err = http.ReadResponse(ubr, creq)
	}
	if err != nil {
		_ = up.Close()
		g.report(r, id, faults.Error, 0)
		return hop{}, nil, deny("PROXY_FAILED", "the leased proxy did not answer the CONNECT; no other proxy could take the request"), false
	}
	if resp.StatusCode/100 == 2 {
		head.n = -1
		_ = up.SetDeadline(time.Time{})
		return hop{up: up, ubr: ubr, head: head}, nil, answer{}, true
	}
	_ = up.Close()
	return hop{}, resp, answer{}, false
}

// siteFailed is the answer when the leased proxy could not reach the
// site: a timeout may pass, a refusal or an unreachable host will not.
func siteFailed(r *request, resp *http.Response) answer {
	why := faults.SquidCode(resp.Header)
	if why == "" {
		why = strconv.Itoa(resp.StatusCode)
	}
	_, errno, _ := strings.Cut(resp.Header.Get("X-Squid-Error"), " ")
	if resp.StatusCode == http.StatusGatewayTimeout || why == "ERR_READ_TIMEOUT" || errno == "110" {
		return deny("SITE_TIMEOUT", fmt.Sprintf("%s:%d did not answer the leased proxy in time (%s); the proxy is not blamed", r.host, r.port, clip(why)))
	}
	return deny("SITE_UNREACHABLE", fmt.Sprintf("%s:%d refused the leased proxy's connection or is unreachable (%s); the proxy is not blamed", r.host, r.port, clip(why)))
}

// send has t's proxy open a tunnel to the checked address, as open
// does, and sends the plain request through it itself: the proxy never
// sees the name, so it cannot resolve it anew to somewhere else (DNS
// rebinding), and the site gets the request as the client wrote it,
// Host and all (a proxy forwarding an absolute URI rewrites Host from it).
// Interim answers (100 Continue) go on to the client as they come. Once
// the tunnel is open, the proxy only carries bytes: what fails after
// that is the site's.
func (g *Gateway) send(r *request, req *http.Request, t *try, c net.Conn) (hop, answer, bool) {
	h, a, ok := g.open(r, t)
	if !ok {
		return h, a, false
	}
	up := bounded{Conn: h.up, idle: g.o.IdleTimeout, deadline: r.started.Add(g.o.TunnelTimeout)}
	h.head.r = up
	out := req.Clone(r.ctx)
	removeHopByHop(out.Header)
	out.URL = &neturl.URL{Path: req.URL.Path, RawPath: req.URL.RawPath, RawQuery: req.URL.RawQuery, ForceQuery: req.URL.ForceQuery}
	out.Close = true // one request per tunnel: the lease ends with it
	gate := newBodyGate(out)
	wrote := make(chan error, 1)
	go func() { wrote <- out.Write(metered{Conn: up, bytes: r.bytes}) }()
	// The answer's head is bounded (it comes from the site); its body is
	// not.
	h.head.n = 4 * g.o.MaxHeaderBytes
	var resp *http.Response
	var err error
	for {
		if resp, err = http.ReadResponse(h.ubr, req); err != nil || resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			break
		}
		// An interim answer goes to the client as it is; a 100 lets the
		// body go on.
		if resp.StatusCode == http.StatusContinue {
			gate.open()
		}
		if _, werr := fmt.Fprintf(c, "HTTP/1.1 %s\r\n\r\n", resp.Status); werr != nil {
			err = werr
			break
		}
	}
	h.head.n = -1
	gate.close()
	if err != nil {
		_ = up.Close()
		g.report(r, t.lease.GetLeaseId(), faults.TargetError, 0)
		return hop{}, deny("SITE_FAILED", fmt.Sprintf("%s:%d gave no answer through the leased proxy; the proxy is not blamed", r.host, r.port)), false
	}
	// The final answer came: the request went whole, or the server
	// answered before taking its body (refused, or not asked for), which
	// is then left on the client's connection.
	select {
	case werr := <-wrote:
		h.unread = werr != nil
	case <-time.After(100 * time.Millisecond):
		h.unread = true
	}
	h.up, h.resp = up, resp
	return h, answer{}, true
}

// bodyGate holds a request's body back until the server asked for it
// (100 Continue), or a second passed without an answer, as RFC 9110's
// Expect: 100-continue has a client do; a final answer first means the
// body is never sent.
type bodyGate struct {
	body   io.ReadCloser
	once   sync.Once
	opened chan struct{}
	sent   bool // the body was let through, under once
}

// errBodyRefused ends a request whose body the server answered before
// asking for it.
var errBodyRefused = errors.New("answered before its body was sent")

// continueWait is how long a body waits for a 100 Continue before it
// goes anyway, as net/http's Transport.ExpectContinueTimeout.
const continueWait = time.Second

// newBodyGate gates out's body if it expects 100-continue; otherwise the
// gate is open.
func newBodyGate(out *http.Request) *bodyGate {
	g := &bodyGate{opened: make(chan struct{})}
	if out.Body == nil || out.Body == http.NoBody || !strings.EqualFold(out.Header.Get("Expect"), "100-continue") {
		g.open()
		return g
	}
	g.body = out.Body
	out.Body = g
	time.AfterFunc(continueWait, g.open)
	return g
}

func (g *bodyGate) open()  { g.once.Do(func() { g.sent = true; close(g.opened) }) }
func (g *bodyGate) close() { g.once.Do(func() { close(g.opened) }) }

func (g *bodyGate) Read(p []byte) (int, error) {
	<-g.opened
	if !g.sent {
		return 0, errBodyRefused
	}
	return g.body.Read(p)
}

func (g *bodyGate) Close() error { return g.body.Close() }

// errorPage is the gateway's answer in place of an error page (a
// proxy's, or a site's dressed as one) the fault table judged res; false
// when it judged it served (a Squid code on a 4xx: passed on as it is).
func errorPage(r *request, status int, res faults.Result) (answer, bool) {
	switch res {
	case faults.RateLimited:
		return deny("SITE_RATE_LIMITED", fmt.Sprintf("%s rate-limited the leased proxy (%d); reported, it cools down for the site: retry", r.host, status)), true
	case faults.Blocked:
		return deny("SITE_BLOCKED", fmt.Sprintf("%s refused the leased proxy (%d); reported, it cools down for the site: retry", r.host, status)), true
	case faults.TargetError:
		return deny("SITE_FAILED", fmt.Sprintf("%s could not be fetched through the leased proxy (%d); the proxy is not blamed", r.host, status)), true
	}
	return answer{}, false
}

// sniffer passes a body through and keeps the first bytes the fault
// table searches for block markers.
type sniffer struct {
	body io.ReadCloser
	head []byte
}

func (s *sniffer) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	if room := faults.MarkerWindow() - len(s.head); room > 0 {
		s.head = append(s.head, p[:min(n, room)]...)
	}
	return n, err
}

func (s *sniffer) Close() error { return s.body.Close() }
