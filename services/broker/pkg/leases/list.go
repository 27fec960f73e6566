package leases

import (
	"context"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// ListProxies serves LeaseService.ListProxies for c.
func (s *Service) ListProxies(ctx context.Context, c access.Caller, req *leasev1.ListProxiesRequest) (*leasev1.ListProxiesResponse, error) {
	if err := firstErr(checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace()), checkTarget(req.GetTarget())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	cur, err := readCursor(req)
	if err != nil {
		return nil, err
	}
	t := c.Tenant
	ns, sel, err := t.Scope(req.GetNamespace(), req.GetSelector())
	if err != nil {
		return nil, err
	}
	ps, more := s.inv.Page(ns, sel, req.Healthy, cur.after, cur.size)
	next := cur.next(ps, more)
	uids := make([]string, len(ps))
	for i, p := range ps {
		uids[i] = p.UID
	}
	states, err := s.store.States(ctx, req.GetTarget(), t.Name, uids)
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ListProxiesResponse{Proxies: make([]*leasev1.Proxy, 0, len(ps)), NextPageToken: next}
	for _, p := range ps {
		resp.Proxies = append(resp.Proxies, toProto(p, states[p.UID]))
	}
	return resp, nil
}
