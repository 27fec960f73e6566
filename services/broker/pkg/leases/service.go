// Package leases implements egressproxies.lease.v1.LeaseService on the
// inventory (which proxies exist) and the store (leases, loads, cooldowns).
package leases

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Config bounds leases.
type Config struct {
	// DefaultTTL applies when a request's ttlSeconds is 0.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound ttlSeconds.
	MinTTL, MaxTTL time.Duration
	// Cooldown is how long a rate_limited report keeps the proxy away from
	// that target.
	Cooldown time.Duration
	// LeaseCap is the most live leases one proxy may hold; 0 means no cap.
	LeaseCap int
}

// DefaultConfig is what the flags default to.
var DefaultConfig = Config{DefaultTTL: 5 * time.Minute, MinTTL: 10 * time.Second, MaxTTL: time.Hour, Cooldown: 15 * time.Minute, LeaseCap: 10}

// Service is the LeaseService server.
type Service struct {
	leasev1.UnimplementedLeaseServiceServer
	inv   *inventory.Inventory
	store *store.Store
	cfg   Config
}

// New returns a Service.
func New(inv *inventory.Inventory, st *store.Store, cfg Config) *Service {
	return &Service{inv: inv, store: st, cfg: cfg}
}

// ErrorDomain is the domain of the ErrorInfo details the service returns.
const ErrorDomain = "egress-proxies.broker"

var (
	leaseIDPattern = regexp.MustCompile(`^[0-9a-f]{32}$`)
	keyPattern     = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	dnsLabel       = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	hostPattern    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9.:\[\]]{0,251}[A-Za-z0-9\]])?$`)
)

func invalid(field, format string, args ...any) error {
	st := status.New(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
	st, _ = st.WithDetails(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: fmt.Sprintf(format, args...)}}})
	return st.Err()
}

func checkLeaseID(id string) error {
	if !leaseIDPattern.MatchString(id) {
		return invalid("leaseID", "must be the 32 lower-case hex characters CreateLease returned")
	}
	return nil
}

func checkSelector(sel map[string]string) error {
	if len(sel) > 32 {
		return invalid("selector", "at most 32 pairs")
	}
	for k, v := range sel {
		if !keyPattern.MatchString(k) {
			return invalid("selector", "key %q must be 1-63 characters of letters, digits, '-', '_' or '.'", k)
		}
		if v == "" {
			return invalid("selector."+k, "must not be empty")
		}
		if len(v) > 63 {
			return invalid("selector."+k, "must be at most 63 characters")
		}
	}
	return nil
}

func checkNamespace(ns string) error {
	if ns != "" && !dnsLabel.MatchString(ns) {
		return invalid("namespace", "%q is not a namespace name", ns)
	}
	return nil
}

func checkTarget(t string) error {
	if t != "" && !hostPattern.MatchString(t) {
		return invalid("target", "must be a host name such as example.com")
	}
	return nil
}

func (s *Service) ttl(secs int32) (time.Duration, error) {
	if secs == 0 {
		return s.cfg.DefaultTTL, nil
	}
	d := time.Duration(secs) * time.Second
	if d < s.cfg.MinTTL || d > s.cfg.MaxTTL {
		return 0, invalid("ttlSeconds", "must be between %d and %d (0 means the default, %d)",
			int(s.cfg.MinTTL.Seconds()), int(s.cfg.MaxTTL.Seconds()), int(s.cfg.DefaultTTL.Seconds()))
	}
	return d, nil
}

// storeError maps store errors to the documented codes.
func storeError(err error) error {
	var nc *store.NoCandidateError
	var un *store.UnavailableError
	switch {
	case errors.Is(err, store.ErrLeaseNotFound):
		return status.Error(codes.NotFound, "lease not found or expired")
	case errors.As(err, &nc):
		noCandidate.WithLabelValues(nc.Reason()).Inc()
		st := status.New(codes.ResourceExhausted, "no proxy available: "+nc.Error())
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: nc.Reason(), Domain: ErrorDomain, Metadata: map[string]string{
			"candidates": strconv.Itoa(nc.Candidates), "coolingDown": strconv.Itoa(nc.CoolingDown), "atCap": strconv.Itoa(nc.AtCap),
			"healthStale": strconv.Itoa(nc.Stale),
		}})
		return st.Err()
	case errors.As(err, &un):
		return status.Error(codes.Unavailable, "lease store unavailable; nothing was changed, retry later")
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		return status.Error(codes.Internal, err.Error())
	}
}

func toProto(p inventory.Proxy, load int) *leasev1.Proxy {
	return &leasev1.Proxy{Id: p.ID, Ip: p.IP, Port: p.Port, Attributes: p.Attributes, Healthy: p.Healthy, LeaseCount: int32(load), EgressIp: p.EgressIP}
}

func (s *Service) checkSynced() error {
	if !s.inv.Synced() {
		return status.Error(codes.Unavailable, "the proxy inventory has not synced with the API server yet")
	}
	return nil
}

// ListProxies implements LeaseService.
func (s *Service) ListProxies(ctx context.Context, req *leasev1.ListProxiesRequest) (*leasev1.ListProxiesResponse, error) {
	if err := firstErr(checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	var healthy *bool
	if req.Healthy != nil {
		h := req.GetHealthy()
		healthy = &h
	}
	ps := s.inv.Select(req.GetNamespace(), req.GetSelector(), healthy, false)
	ids := make([]string, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	loads, err := s.store.Loads(ctx, ids)
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ListProxiesResponse{Proxies: make([]*leasev1.Proxy, 0, len(ps))}
	for _, p := range ps {
		resp.Proxies = append(resp.Proxies, toProto(p, loads[p.ID]))
	}
	return resp, nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// CreateLease implements LeaseService.
func (s *Service) CreateLease(ctx context.Context, req *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	ttl, err := s.ttl(req.GetTtlSeconds())
	if err := firstErr(err, checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace()), checkTarget(req.GetTarget())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	cands := s.inv.Select(req.GetNamespace(), req.GetSelector(), nil, true)
	if len(cands) == 0 {
		// Say why when the reason is the probe fleet, not the selector.
		stale := 0
		for _, p := range s.inv.Select(req.GetNamespace(), req.GetSelector(), nil, false) {
			if p.HealthStale {
				stale++
			}
		}
		return nil, storeError(&store.NoCandidateError{Stale: stale})
	}
	ids := make([]string, len(cands))
	for i, p := range cands {
		ids[i] = p.ID
	}
	l, err := s.store.Acquire(ctx, ids, req.GetTarget(), ttl, s.cfg.LeaseCap)
	if err != nil {
		return nil, storeError(err)
	}
	leasesCreated.Inc()
	p, _ := s.inv.Get(l.Proxy)
	return &leasev1.CreateLeaseResponse{LeaseId: l.ID, Proxy: toProto(p, l.Load), ExpiresAt: timestamppb.New(l.Expires)}, nil
}

// RenewLease implements LeaseService.
func (s *Service) RenewLease(ctx context.Context, req *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error) {
	ttl, err := s.ttl(req.GetTtlSeconds())
	if err := firstErr(checkLeaseID(req.GetLeaseId()), err); err != nil {
		return nil, err
	}
	l, err := s.store.Renew(ctx, req.GetLeaseId(), ttl)
	if err != nil {
		return nil, storeError(err)
	}
	leasesRenewed.Inc()
	return &leasev1.RenewLeaseResponse{LeaseId: l.ID, ExpiresAt: timestamppb.New(l.Expires)}, nil
}

// ReleaseLease implements LeaseService; releasing an unknown or released
// lease succeeds.
func (s *Service) ReleaseLease(ctx context.Context, req *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error) {
	if err := checkLeaseID(req.GetLeaseId()); err != nil {
		return nil, err
	}
	released, err := s.store.Release(ctx, req.GetLeaseId())
	if err != nil {
		return nil, storeError(err)
	}
	if released {
		leasesReleased.Inc()
	}
	return &leasev1.ReleaseLeaseResponse{}, nil
}

// Report results.
const (
	ResultOK          = "ok"
	ResultRateLimited = "rate_limited"
	ResultBlocked     = "blocked"
	ResultError       = "error"
)

// ReportLease implements LeaseService.
func (s *Service) ReportLease(ctx context.Context, req *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error) {
	if err := firstErr(checkLeaseID(req.GetLeaseId()), checkTarget(req.GetTarget())); err != nil {
		return nil, err
	}
	switch req.GetResult() {
	case ResultOK, ResultBlocked, ResultError:
		if _, err := s.store.Get(ctx, req.GetLeaseId()); err != nil {
			return nil, storeError(err)
		}
		reports.WithLabelValues(req.GetResult()).Inc()
		return &leasev1.ReportLeaseResponse{}, nil
	case ResultRateLimited:
	default:
		return nil, invalid("result", "must be one of ok, rate_limited, blocked, error (got %q)", req.GetResult())
	}
	target := req.GetTarget()
	if target == "" {
		l, err := s.store.Get(ctx, req.GetLeaseId())
		if err != nil {
			return nil, storeError(err)
		}
		if target = l.Target; target == "" {
			return nil, invalid("target", "is required for rate_limited when the lease was created without one")
		}
	}
	until, err := s.store.Cooldown(ctx, req.GetLeaseId(), target, s.cfg.Cooldown)
	if err != nil {
		return nil, storeError(err)
	}
	reports.WithLabelValues(ResultRateLimited).Inc()
	return &leasev1.ReportLeaseResponse{CooldownUntil: timestamppb.New(until)}, nil
}
