package leases

import (
	"context"
	"errors"
	"fmt"
	"time"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// RenewLease serves LeaseService.RenewLease for c. A lease is renewed only while its
// proxy is leasable at the address it was leased at.
func (s *Service) RenewLease(ctx context.Context, c access.Caller, req *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error) {
	ttl, err := s.ttl(req.GetTtlSeconds())
	if err := firstErr(checkLeaseID(req.GetLeaseId()), err); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	l, err := s.store.Get(ctx, req.GetLeaseId())
	if err != nil {
		return nil, storeError(err)
	}
	if t := c.Tenant; l.Owner != t.Name {
		return nil, notOwner(t, l.ID)
	}
	until, lost := s.renewable(l)
	if lost == nil {
		l, err = s.store.Renew(ctx, l, ttl, until)
		if errors.Is(err, store.ErrPastUntil) {
			lost = &proxyLost{v1.NotLeasableDraining, "the proxy is draining and its drain deadline has passed"}
		} else if err != nil {
			return nil, storeError(err)
		}
	}
	if lost != nil {
		renewRefused.WithLabelValues(lost.reason).Inc()
		return nil, lost.status()
	}
	leasesRenewed.Inc()
	return &leasev1.RenewLeaseResponse{LeaseId: l.ID, ExpiresAt: timestamppb.New(l.Expires)}, nil
}

// proxyLost says why a lease's proxy can no longer be renewed.
type proxyLost struct{ reason, why string }

func (e *proxyLost) status() error {
	st := status.New(codes.FailedPrecondition, "the lease can no longer be renewed: "+e.why+"; release it and lease another proxy")
	st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: e.reason, Domain: ErrorDomain})
	return st.Err()
}

// renewable says whether l may be renewed, and until when: a draining
// proxy's leases renew up to its drain deadline and no further (the store
// holds them to it by Redis's clock), so the pool can delete it on time
// without cutting a lease short; a cordoned one's renew as before.
func (s *Service) renewable(l *store.Lease) (until time.Time, lost *proxyLost) {
	p, ok := s.inv.Get(l.Proxy)
	if !ok {
		return time.Time{}, &proxyLost{"PROXY_GONE", "the proxy was deleted"}
	}
	reason, why := p.NotLeasable()
	switch {
	case reason == v1.NotLeasableDraining:
		until = p.DrainDeadline
	case reason == v1.NotLeasableCordoned:
	case reason != "":
		return time.Time{}, &proxyLost{reason, why}
	}
	if p.Addr() != l.Addr {
		return time.Time{}, &proxyLost{"PROXY_ADDRESS_CHANGED", fmt.Sprintf("the proxy moved from %s to %s", l.Addr, p.Addr())}
	}
	return until, nil
}
