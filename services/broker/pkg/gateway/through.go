package gateway

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// try is one lease a request went through, and how many proxies the
// request has tried with it.
type try struct {
	lease *leasev1.CreateLeaseResponse
	n     int
}

// The headers naming what served a request (docs/api/clients.md, "Whose fault"):
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
				g.log.Warn("gateway could not lease", "tenant", r.caller.Name, "target", r.host, "err", err)
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
		lease, err := g.leaser.CreateLease(r.ctx, r.caller, req)
		if err == nil || !wait || !slotWait[refusal(err).reason] || !time.Now().Add(pause).Before(deadline) {
			if waited {
				capacityWaits.WithLabelValues(map[bool]string{true: "leased", false: "refused"}[err == nil]).Inc()
			}
			access.Called(r.caller, "CreateLease", err)
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
