package leases

import (
	"context"
	"errors"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// ReleaseLease serves LeaseService.ReleaseLease for c; releasing an unknown or released
// lease succeeds.
func (s *Service) ReleaseLease(ctx context.Context, c access.Caller, req *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error) {
	if err := checkLeaseID(req.GetLeaseId()); err != nil {
		return nil, err
	}
	t := c.Tenant
	released, err := s.store.Release(ctx, req.GetLeaseId(), t.Name)
	if errors.Is(err, store.ErrNotOwner) {
		return nil, notOwner(t, req.GetLeaseId())
	}
	if err != nil {
		return nil, storeError(err)
	}
	if released {
		leasesReleased.Inc()
	}
	return &leasev1.ReleaseLeaseResponse{}, nil
}
