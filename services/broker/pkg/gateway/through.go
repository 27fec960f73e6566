package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
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
	resp *http.Response
}

// through leases a proxy for r and has it take the request. While the
// leased proxy fails on its own hop before any byte reached the client
// (no answer, a refused dial or credentials, an error of its own), the
// failure is reported against it and another proxy is leased, at most
// Retries more times; a session whose proxy failed moves with it. A
// non-nil answer is the client's refusal, to be written once every lease
// it took is released.
func (g *Gateway) through(r *request, req *http.Request) (hop, *try, *answer) {
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
		lease, err := g.leaser.CreateLease(r.ctx, &leasev1.CreateLeaseRequest{Namespace: r.opts.namespace, Selector: r.opts.selector,
			Target: r.host, SessionKey: r.opts.session, TtlSeconds: int32(g.o.LeaseTTL.Seconds())})
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
			h, a, ok = g.send(r, req, t)
		}
		if ok {
			return h, t, nil
		}
		t.tag(&a)
		if a.fault != faults.Proxy || !resendable(req) {
			g.release(r, lease.GetLeaseId())
			return hop{}, nil, &a
		}
		failed = append(failed, lease.GetLeaseId())
		last = &a
		n++
	}
	return hop{}, nil, last
}

// resendable says whether req may go to another proxy after one failed:
// a CONNECT, or a request without a body (the first try consumed it).
func resendable(req *http.Request) bool {
	return req.Method == http.MethodConnect || (req.ContentLength == 0 && len(req.TransferEncoding) == 0)
}

// open has t's proxy open a tunnel to the checked address. Its answer
// to CONNECT is its own (a site never sees the CONNECT), so the fault
// table's verdict on it is sound: the proxy's own failure is reported
// against it, a site it could not reach is the site's, and its egress
// policy's refusal is nobody's.
func (g *Gateway) open(r *request, t *try) (hop, answer, bool) {
	id := t.lease.GetLeaseId()
	up, err := g.dial(r, t.lease)
	if err != nil {
		g.report(r, id, faults.Error, 0)
		return hop{}, deny("PROXY_UNREACHABLE", "the leased proxy did not answer; no other proxy could take the request"), false
	}
	target := net.JoinHostPort(r.addr.String(), strconv.Itoa(int(r.port)))
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
		return hop{}, deny("PROXY_FAILED", "the leased proxy did not answer the CONNECT; no other proxy could take the request"), false
	}
	if resp.StatusCode/100 == 2 {
		head.n = -1
		_ = up.SetDeadline(time.Time{})
		return hop{up: up, ubr: ubr}, answer{}, true
	}
	_ = up.Close()
	class := faults.Connect(resp.StatusCode, resp.Header)
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

// send has t's proxy forward a plain request, and reads its answer's
// head. Only what happens on the proxy's own hop fails it here: no
// answer at all, or a 407 with its challenge (our credentials refused).
func (g *Gateway) send(r *request, req *http.Request, t *try) (hop, answer, bool) {
	id := t.lease.GetLeaseId()
	up, err := g.dial(r, t.lease)
	if err != nil {
		g.report(r, id, faults.Error, 0)
		return hop{}, deny("PROXY_UNREACHABLE", "the leased proxy did not answer; no other proxy could take the request"), false
	}
	deadline := r.started.Add(g.o.TunnelTimeout)
	_ = up.SetDeadline(deadline)
	out := req.Clone(r.ctx)
	removeHopByHop(out.Header)
	out.Close = true // one request per upstream connection: the lease ends with it
	credentials(t.lease).Authorize(out.Header)
	var resp *http.Response
	if err = out.WriteProxy(up); err == nil {
		// The answer's head is bounded (it comes from the site, through
		// the proxy); its body is not.
		head := &headLimit{r: up, n: 4 * g.o.MaxHeaderBytes}
		resp, err = http.ReadResponse(bufio.NewReader(head), req)
		head.n = -1
	}
	if err != nil {
		_ = up.Close()
		g.report(r, id, faults.Error, 0)
		return hop{}, deny("PROXY_FAILED", "the leased proxy gave no answer; no other proxy could take the request"), false
	}
	if faults.Response(resp.StatusCode, resp.Header, nil) == faults.Error {
		_ = resp.Body.Close()
		_ = up.Close()
		g.report(r, id, faults.Error, resp.StatusCode)
		return hop{}, deny("PROXY_FAILED", "the leased proxy refused its credentials; no other proxy could take the request"), false
	}
	return hop{up: up, resp: resp}, answer{}, true
}

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
