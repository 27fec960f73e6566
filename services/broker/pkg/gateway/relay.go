package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// afterwards is a context for a call about r's lease once r's own may
// have ended (the tunnel outlived its deadline, the client left), with a
// bound of its own. Renewals check the credential again (renew.go).
func (r *request) afterwards() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 10*time.Second)
}

// release ends the lease, whatever happened to the client.
func (g *Gateway) release(r *request, id string) {
	ctx, cancel := r.afterwards()
	defer cancel()
	_, err := g.leaser.ReleaseLease(ctx, r.caller, &leasev1.ReleaseLeaseRequest{LeaseId: id})
	access.Called(r.caller, "ReleaseLease", err)
	if err != nil {
		// It expires at its TTL, the tunnel timeout.
		releaseFailed.Inc()
		g.log.Warn("gateway could not release a lease; it expires at its TTL", "tenant", r.caller.Name, "lease", id, "err", err)
	}
}

// report tells the broker how the target treated the leased proxy, or
// (faults.Error) that the proxy itself failed.
func (g *Gateway) report(r *request, id string, o faults.Result, statusCode int) {
	outcomes.WithLabelValues(r.kind, string(o)).Inc()
	ctx, cancel := r.afterwards()
	defer cancel()
	latency := min(time.Since(r.started).Milliseconds(), 3_600_000)
	_, err := g.leaser.ReportLease(ctx, r.caller, &leasev1.ReportLeaseRequest{LeaseId: id, Target: r.host, Result: string(o), StatusCode: int32(statusCode), LatencyMs: int32(latency)})
	access.Called(r.caller, "ReportLease", err)
	if err != nil {
		reportFailed.Inc()
		g.log.Debug("gateway report failed", "tenant", r.caller.Name, "lease", id, "err", err)
	}
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
	who := access.Label(r.caller.Name)
	access.GatewayBytes.WithLabelValues(who, "sent").Add(float64(sent))
	access.GatewayBytes.WithLabelValues(who, "received").Add(float64(received))
	if received > 0 && clean {
		g.report(r, t.lease.GetLeaseId(), faults.OK, 0)
	}
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

// readCloser reads r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }

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
