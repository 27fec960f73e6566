// Package leaseclient is the Go client crawler code uses to take proxies
// from the broker: lease one, keep it alive while crawling, report how the
// target treated it, release it.
//
//	c, _ := leaseclient.Dial("broker:9090", leaseclient.WithToken(token))
//	l, _ := c.Lease(ctx, leaseclient.Request{Selector: map[string]string{"geo": "eu"}, Target: "example.com"})
//	defer l.Release(context.Background())
//	stop := l.AutoRenew(ctx, time.Minute)
//	defer stop()
//	httpClient := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(l.ProxyURL())}}
package leaseclient

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/faults"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// Client talks to the broker's gRPC LeaseService.
type Client struct {
	conn *grpc.ClientConn
	api  leasev1.LeaseServiceClient
}

type options struct {
	token *auth.Token
	tls   credentials.TransportCredentials
}

// Option configures Dial.
type Option func(*options)

// WithToken sends a bearer token on every call.
func WithToken(token string) Option { return WithTokenSource(auth.Static(token)) }

// WithTokenSource sends the token t holds on every call: a token file
// that is re-read when it changes (auth.FromFile), so a rotated token
// takes effect without a new client.
func WithTokenSource(t *auth.Token) Option { return func(o *options) { o.token = t } }

// WithTLS uses TLS instead of a plain-text connection.
func WithTLS(c credentials.TransportCredentials) Option { return func(o *options) { o.tls = c } }

// WithCAFile uses TLS, verifying the broker's certificate with the PEM CA
// bundle in file (read now) and the dialed host name.
func WithCAFile(file string) (Option, error) {
	cfg, err := certs.ClientConfig(file, "")
	if err != nil {
		return nil, err
	}
	return WithTLS(credentials.NewTLS(cfg)), nil
}

// Dial connects lazily to target ("host:port").
func Dial(target string, opts ...Option) (*Client, error) {
	o := options{tls: insecure.NewCredentials()}
	for _, f := range opts {
		f(&o)
	}
	dial := []grpc.DialOption{grpc.WithTransportCredentials(o.tls), grpc.WithUnaryInterceptor(withRequestID)}
	if o.token != nil {
		dial = append(dial, o.token.DialOption())
	}
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, api: leasev1.NewLeaseServiceClient(conn)}, nil
}

// withRequestID gives every CreateLease that has none a request id, the
// raw API()'s too: whatever retries the call (gRPC, the caller after a
// timeout with the same message) gets the lease the first try made
// rather than a second proxy.
func withRequestID(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if r, ok := req.(*leasev1.CreateLeaseRequest); ok && r.GetRequestId() == "" {
		r.RequestId = rand.Text()
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// API is the raw generated client, for calls this package does not wrap.
func (c *Client) API() leasev1.LeaseServiceClient { return c.api }

// Request asks for a lease.
type Request struct {
	Selector  map[string]string
	Target    string
	Namespace string
	// TTL is rounded down to seconds; 0 means the broker's default.
	TTL time.Duration
	// RequestID names this request, so that a retry after a timeout gets
	// the lease the first try made instead of a second proxy. Empty: Lease
	// makes a random one and uses it for its own retries.
	RequestID string
	// SessionKey keeps the same proxy for every lease with this key while
	// one lives and the proxy qualifies (a login session keeps its IP).
	SessionKey string
}

// attempts bounds Lease's tries when the broker is unavailable.
const attempts = 3

// ErrNoProxy is returned (wrapped in a *NoProxyError) when no proxy is
// available; retry later or widen the selector.
var ErrNoProxy = errors.New("no proxy available")

// NoProxyError says why no proxy could be leased.
type NoProxyError struct {
	// Reason is NO_MATCHING_PROXY, HEALTH_STALE, ALL_QUARANTINED,
	// ALL_COOLING_DOWN, ALL_AT_CAP, ALL_COOLING_DOWN_OR_AT_CAP,
	// TARGET_AT_CAP, TARGET_PACED, TOKEN_LEASE_CAP or STORE_FULL
	// (docs/api/errors-and-metrics.md).
	Reason  string
	Message string
	// RetryAfter is how long the broker asks the caller to wait: for a
	// paced target, until its next lease is due.
	RetryAfter time.Duration
}

func (e *NoProxyError) Error() string { return e.Message }
func (e *NoProxyError) Unwrap() error { return ErrNoProxy }

// Lease is a live lease.
type Lease struct {
	ID    string
	Proxy *leasev1.Proxy
	// Credentials the proxy asks for, or nil; ProxyURL carries them.
	Credentials *leasev1.ProxyCredentials
	Target      string
	// SessionMoved: the request's session key held another proxy, which
	// no longer qualified.
	SessionMoved bool
	c            *Client
	mu           sync.Mutex
	expires      time.Time
	released     bool
}

// Lease takes a proxy. A broker that is unavailable (restarting, or its
// Redis failing over) is tried again, with the same request id.
func (c *Client) Lease(ctx context.Context, r Request) (*Lease, error) {
	req := &leasev1.CreateLeaseRequest{
		Selector: r.Selector, Target: r.Target, Namespace: r.Namespace, TtlSeconds: int32(r.TTL / time.Second), RequestId: r.RequestID,
		SessionKey: r.SessionKey,
	}
	var resp *leasev1.CreateLeaseResponse
	var err error
	for try := range attempts {
		if resp, err = c.api.CreateLease(ctx, req); status.Code(err) != codes.Unavailable || try == attempts-1 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(time.Duration(try+1) * 100 * time.Millisecond):
		}
	}
	if err != nil {
		if st, ok := status.FromError(err); ok && st.Code() == codes.ResourceExhausted {
			ne := &NoProxyError{Message: st.Message()}
			ne.Reason, ne.RetryAfter = Details(st)
			return nil, ne
		}
		return nil, err
	}
	return &Lease{ID: resp.GetLeaseId(), Proxy: resp.GetProxy(), Credentials: resp.GetCredentials(), Target: r.Target, SessionMoved: resp.GetSessionMoved(),
		c: c, expires: resp.GetExpiresAt().AsTime()}, nil
}

// Expires is the lease's current expiry.
func (l *Lease) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// ProxyURL is the proxy as an http:// URL, for http.ProxyURL, with the
// proxy's credentials as its user info when it asks for some (Go's
// transport sends them as Proxy-Authorization, on CONNECT too).
func (l *Lease) ProxyURL() *url.URL {
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort(l.Proxy.GetIp(), strconv.Itoa(int(l.Proxy.GetPort())))}
	if c := l.Credentials; c.GetUsername() != "" {
		u.User = url.UserPassword(c.GetUsername(), c.GetPassword())
	}
	return u
}

// Renew extends the lease by ttl from now (0: the broker's default).
func (l *Lease) Renew(ctx context.Context, ttl time.Duration) error {
	resp, err := l.c.api.RenewLease(ctx, &leasev1.RenewLeaseRequest{LeaseId: l.ID, TtlSeconds: int32(ttl / time.Second)})
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.expires = resp.GetExpiresAt().AsTime()
	l.mu.Unlock()
	return nil
}

// ErrLeaseLost is returned (wrapped in a *LostError) when a lease can no
// longer be renewed: it expired, or its proxy left the leasable set.
var ErrLeaseLost = errors.New("lease lost")

// LostError says why a lease was lost.
type LostError struct {
	LeaseID string
	// Reason is PROXY_GONE, PROXY_DELETING, PROXY_UNHEALTHY,
	// PROXY_HEALTH_STALE, PROXY_NOT_READY or PROXY_ADDRESS_CHANGED when
	// the proxy left the leasable set; empty when the lease expired.
	Reason string
	Err    error
}

func (e *LostError) Error() string   { return fmt.Sprintf("lease %s lost: %v", e.LeaseID, e.Err) }
func (e *LostError) Unwrap() []error { return []error{ErrLeaseLost, e.Err} }

// lost turns a renewal's error into a *LostError when the lease is gone
// for good, or nil when a retry may succeed.
func (l *Lease) lost(err error) *LostError {
	st, ok := status.FromError(err)
	if !ok || (st.Code() != codes.NotFound && st.Code() != codes.FailedPrecondition) {
		return nil
	}
	le := &LostError{LeaseID: l.ID, Err: err}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			le.Reason = info.GetReason()
		}
	}
	return le
}

// AutoRenew renews the lease every interval, each time for ttl, until the
// returned stop is called, ctx ends, or a renewal finds the lease lost: it
// expired, or its proxy left the leasable set (onLost, if given, hears why,
// as a *LostError). Transient errors are retried at the next tick; pick
// interval well below the TTL.
func (l *Lease) AutoRenew(ctx context.Context, interval, ttl time.Duration, onLost func(error)) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if lost := l.lost(l.Renew(ctx, ttl)); lost != nil {
				if onLost != nil {
					onLost(lost)
				}
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// Report results: the fault table's (pkg/faults, docs/api/clients.md "Whose
// fault"). ResultError is the proxy's own failure, ResultTargetError the
// site's through a working proxy, which counts against no proxy.
const (
	ResultOK          = string(faults.OK)
	ResultRateLimited = string(faults.RateLimited)
	ResultBlocked     = string(faults.Blocked)
	ResultError       = string(faults.Error)
	ResultTargetError = string(faults.TargetError)
)

// Outcome is how a target treated a request through the proxy.
type Outcome struct {
	// Result is ResultOK, ResultRateLimited, ResultBlocked, ResultError or
	// ResultTargetError.
	Result string
	// Target the result is about; the lease's target when empty.
	Target string
	// StatusCode the target answered (0: none) and Latency of the request
	// (0: unknown) feed the broker's metrics.
	StatusCode int
	Latency    time.Duration
}

// Report tells the broker how the target treated the proxy and returns
// what the broker did: a cooldown for the proxy's exit IP, pacing for
// the target, a quarantine for the proxy (docs/api/ban-aware.md).
func (l *Lease) Report(ctx context.Context, o Outcome) (*leasev1.ReportLeaseResponse, error) {
	return l.c.api.ReportLease(ctx, &leasev1.ReportLeaseRequest{LeaseId: l.ID, Result: o.Result, Target: o.Target,
		StatusCode: int32(o.StatusCode), LatencyMs: int32(o.Latency / time.Millisecond)})
}

// Release ends the lease; calling it again is harmless.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	if _, err := l.c.api.ReleaseLease(ctx, &leasev1.ReleaseLeaseRequest{LeaseId: l.ID}); err != nil {
		return err
	}
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	return nil
}

// Details reads the broker's error details from st: its ErrorInfo reason
// and its RetryInfo delay (zero values when absent).
func Details(st *status.Status) (reason string, retryAfter time.Duration) {
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			reason = d.GetReason()
		case *errdetails.RetryInfo:
			retryAfter = d.GetRetryDelay().AsDuration()
		}
	}
	return reason, retryAfter
}
