// Package gateway is the broker's HTTP proxy listener: any HTTP client
// (curl, requests, a headless browser) sets it as its proxy and gets the
// fleet, with its ban-aware leasing, without a line of code. Each CONNECT
// tunnel, and each plain-HTTP request, leases a proxy for its target host
// from the lease service (the same service and Redis state as every other
// lease: the gateway is its second transport, beside gRPC and REST),
// goes through that proxy with its credentials, reports what it saw, and
// releases the lease when it ends.
//
// Options travel in the proxy user name, the API token in the password
// (docs/api/gateway.md, "The gateway"). Every destination is resolved here and
// checked against the egress policy before a lease is taken; the proxy
// is only ever given the checked address (a plain request rides a
// CONNECT tunnel to it), so a name that resolves differently at the proxy
// (DNS rebinding) cannot get round the check.
//
// A request's path, file by file: gateway.go listens and bounds the
// connections; admit.go reads a request, authenticates it and checks its
// destination and its tenant's quotas; through.go leases a proxy and
// tries another when one fails; hop.go opens the hop through it (a
// CONNECT, or a plain request riding one); relay.go splices the tunnel
// (tunnel.go) or relays the answer, then reports and releases; renew.go
// keeps the leases of long tunnels alive meanwhile.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/utils/clock"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// Leaser is the part of the lease service the gateway calls, each call
// made by the caller the gateway authenticated; *leases.Service is one.
type Leaser interface {
	CreateLease(context.Context, access.Caller, *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error)
	ReleaseLease(context.Context, access.Caller, *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error)
	ReportLease(context.Context, access.Caller, *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error)
	RenewLease(context.Context, access.Caller, *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error)
}

// Callers says whose each proxy password is; *access.Registry is one.
type Callers interface {
	// Enabled reports whether credentials are configured at all.
	Enabled() bool
	// Gateway is the caller holding password, if it may use the gateway:
	// else an Unauthenticated or PermissionDenied status error.
	Gateway(password string) (access.Caller, error)
	// Recheck is c as its credential stands now, for a tunnel's renewals.
	Recheck(c access.Caller, v access.Verb) (access.Caller, error)
}

// Gateway serves the proxy listeners.
type Gateway struct {
	o       Options
	log     *slog.Logger
	leaser  Leaser
	callers Callers
	ln      net.Listener
	tlsLn   net.Listener // nil without Options.TLSAddr

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

// New binds the listener; callers says whose each proxy password is. The
// gateway refuses to run without credentials: it would be an open proxy
// into the fleet.
func New(log *slog.Logger, o Options, l Leaser, callers Callers) (*Gateway, error) {
	if !callers.Enabled() {
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
	g := &Gateway{o: o, log: log, leaser: l, callers: callers, conns: map[net.Conn]*tunnel{}, perSource: map[netip.Addr]int{}, renewer: renewer{clock: o.Clock}}
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
	go g.renewer.run(ctx, g.leaser, g.callers, g.o.LeaseTTL)
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
