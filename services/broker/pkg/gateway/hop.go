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
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
)

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

// proxyDenied is the answer when the leased proxy's own egress policy
// refused the destination: not the proxy's fault, so nothing is
// reported against it.
func proxyDenied(r *request) answer {
	return deny("PROXY_DENIED", fmt.Sprintf("the leased proxy refused %s:%d (its egress policy); it is not blamed", r.host, r.port))
}

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

func (g *bodyGate) open() { g.once.Do(func() { g.sent = true; close(g.opened) }) }

func (g *bodyGate) close() { g.once.Do(func() { close(g.opened) }) }

func (g *bodyGate) Read(p []byte) (int, error) {
	<-g.opened
	if !g.sent {
		return 0, errBodyRefused
	}
	return g.body.Read(p)
}

func (g *bodyGate) Close() error { return g.body.Close() }
