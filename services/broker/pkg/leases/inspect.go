package leases

import (
	"context"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/util/validation"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// The operator's reads: who holds what, and why a proxy or a target is
// as it is. Each shows a tenant its own leases and cooldowns beside the
// fleet's, and one with the inspect verb every tenant's, on the proxies
// its scope lets it list.

// whose is the tenants whose own cooldowns and leases t may see, as the
// store's inspect reads name them: "*" for every tenant's.
func whose(t *access.Tenant) string {
	if t.Can(access.Inspect) {
		return "*"
	}
	return t.Name
}

func checkProxyID(id string) error {
	ns, name, ok := strings.Cut(id, "/")
	if !ok || len(validation.IsDNS1123Label(ns)) > 0 || len(validation.IsDNS1123Subdomain(name)) > 0 {
		return invalid("id", "%q is not a proxy id: give the Proxy's \"namespace/name\"", id)
	}
	return nil
}

func checkTenantName(name string) error {
	if name != "" && len(validation.IsDNS1123Subdomain(name)) > 0 {
		return invalid("tenant", "%q is not a tenant name", name)
	}
	return nil
}

// visible finds the proxy id names among those t may list.
func (s *Service) visible(t *access.Tenant, id string) (inventory.Proxy, error) {
	ns, sel, err := t.Scope("", nil)
	if err != nil {
		return inventory.Proxy{}, err
	}
	p, ok := s.inv.ByID(id)
	if !ok || !p.Matches(ns, sel) {
		// A proxy outside the caller's scope is as unknown as a missing one.
		return inventory.Proxy{}, status.Errorf(codes.NotFound, "proxy %q not found", id)
	}
	return p, nil
}

// ListLeases serves LeaseService.ListLeases for c. Pages end at a proxy's last lease,
// so a page holds page_size leases or a little more (a proxy's cap).
func (s *Service) ListLeases(ctx context.Context, c access.Caller, req *leasev1.ListLeasesRequest) (*leasev1.ListLeasesResponse, error) {
	if err := firstErr(checkNamespace(req.GetNamespace()), checkTenantName(req.GetTenant())); err != nil {
		return nil, err
	}
	if req.GetProxyId() != "" {
		if err := checkProxyID(req.GetProxyId()); err != nil {
			return nil, err
		}
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	cur, err := newCursor(req.GetPageSize(), req.GetPageToken(),
		fingerprint(strconv.AppendQuote(strconv.AppendQuote(strconv.AppendQuote(nil, req.GetNamespace()), req.GetProxyId()), req.GetTenant())))
	if err != nil {
		return nil, err
	}
	t := c.Tenant
	ns, sel, err := t.Scope(req.GetNamespace(), nil)
	if err != nil {
		return nil, err
	}
	who := whose(t)
	resp := &leasev1.ListLeasesResponse{}
	after := cur.after
	for len(resp.Leases) < cur.size {
		var ps []inventory.Proxy
		more := false
		if id := req.GetProxyId(); id != "" {
			if p, ok := s.inv.ByID(id); ok && id > after && p.Matches(ns, sel) {
				ps = []inventory.Proxy{p}
			}
		} else {
			ps, more = s.inv.Page(ns, sel, nil, after, MaxPageSize)
		}
		if len(ps) == 0 {
			break
		}
		uids := make([]string, len(ps))
		for i, p := range ps {
			uids[i] = p.UID
		}
		held, err := s.store.Leases(ctx, uids)
		if err != nil {
			return nil, storeError(err)
		}
		for _, p := range ps {
			ls := held[p.UID]
			slices.SortFunc(ls, func(a, b store.LiveLease) int { return strings.Compare(a.ID, b.ID) })
			for _, l := range ls {
				if (who == "*" || l.Tenant == who) && (req.GetTenant() == "" || l.Tenant == req.GetTenant()) {
					resp.Leases = append(resp.Leases, &leasev1.Lease{LeaseId: l.ID, ProxyId: p.ID, Tenant: l.Tenant, Target: l.Target,
						SessionKey: l.Session, GrantedAt: timestamp(l.Granted), ExpiresAt: timestamp(l.Expires)})
				}
			}
			after = p.ID
			if len(resp.Leases) >= cur.size {
				more = more || p.ID != ps[len(ps)-1].ID
				break
			}
		}
		if !more {
			after = ""
			break
		}
	}
	if after != "" {
		resp.NextPageToken = pageToken(cur.filter, after)
	}
	return resp, nil
}

func cooldownProto(c store.Cooldown) *leasev1.Cooldown {
	return &leasev1.Cooldown{Target: c.Target, Tenant: c.Tenant, Until: timestamp(c.Until), Since: timestamp(c.Since), Level: int32(c.Level), Key: c.Key}
}

// soonest orders cooldowns by their end, then target and tenant.
func soonest(a, b store.Cooldown) int {
	if c := a.Until.Compare(b.Until); c != 0 {
		return c
	}
	return strings.Compare(a.Target+"#"+a.Tenant, b.Target+"#"+b.Tenant)
}

// ExplainProxy serves LeaseService.ExplainProxy for c.
func (s *Service) ExplainProxy(ctx context.Context, c access.Caller, req *leasev1.ExplainProxyRequest) (*leasev1.ExplainProxyResponse, error) {
	if err := checkProxyID(req.GetId()); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	t := c.Tenant
	p, err := s.visible(t, req.GetId())
	if err != nil {
		return nil, err
	}
	who := whose(t)
	states, err := s.store.States(ctx, "", "", []string{p.UID})
	if err != nil {
		return nil, storeError(err)
	}
	cds, err := s.store.Cooldowns(ctx, "", who, []string{p.UID})
	if err != nil {
		return nil, storeError(err)
	}
	errs, err := s.store.Errors(ctx, p.UID)
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ExplainProxyResponse{Proxy: toProto(p, states[p.UID]), Cordoned: p.Cordoned, DrainingUntil: timestamp(p.DrainDeadline)}
	mine := cds[p.UID]
	slices.SortFunc(mine, soonest)
	for _, c := range mine {
		resp.Cooldowns = append(resp.Cooldowns, cooldownProto(c))
	}
	for _, e := range errs {
		if e.Tenant == "" || who == "*" || e.Tenant == who {
			resp.Errors = append(resp.Errors, &leasev1.ErrorReport{Target: e.Target, Tenant: e.Tenant, At: timestamppb.New(e.At)})
		}
	}
	return resp, nil
}

// ExplainTarget serves LeaseService.ExplainTarget for c.
func (s *Service) ExplainTarget(ctx context.Context, c access.Caller, req *leasev1.ExplainTargetRequest) (*leasev1.ExplainTargetResponse, error) {
	if req.GetTarget() == "" {
		return nil, invalid("target", "is required: a host name such as example.com")
	}
	if err := firstErr(checkTarget(req.GetTarget()), checkNamespace(req.GetNamespace())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	t := c.Tenant
	ns, sel, err := t.Scope(req.GetNamespace(), nil)
	if err != nil {
		return nil, err
	}
	target := strings.ToLower(req.GetTarget())
	ps := s.inv.Select(ns, sel, nil, false)
	uids := make([]string, len(ps))
	for i, p := range ps {
		uids[i] = p.UID
	}
	cds, err := s.store.Cooldowns(ctx, target, whose(t), uids)
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ExplainTargetResponse{Target: target, Proxies: int32(len(ps)), Policy: s.pol.For(target).Source}
	if who := whose(t); who == "*" {
		st, err := s.store.Target(ctx, target)
		if err != nil {
			return nil, storeError(err)
		}
		resp.Leases, resp.PacePerSecond, resp.PacedUntil = int32(st.Leases), st.Pace, timestamp(st.PacedUntil)
	} else {
		// The fleet's count and pace would tell whether another tenant
		// crawls the target: without inspect, a caller counts its own.
		live, err := s.store.Leases(ctx, uids)
		if err != nil {
			return nil, storeError(err)
		}
		for _, ls := range live {
			for _, l := range ls {
				if l.Tenant == who && l.Target == target {
					resp.Leases++
				}
			}
		}
	}
	type cooling struct {
		p inventory.Proxy
		c store.Cooldown
	}
	var all []cooling
	for _, p := range ps {
		for _, c := range cds[p.UID] {
			all = append(all, cooling{p, c})
		}
	}
	slices.SortFunc(all, func(a, b cooling) int {
		if c := soonest(a.c, b.c); c != 0 {
			return c
		}
		return strings.Compare(a.p.ID, b.p.ID)
	})
	for _, c := range all {
		resp.Cooling = append(resp.Cooling, &leasev1.CoolingProxy{ProxyId: c.p.ID, EgressIp: c.p.EgressIP, Cooldown: cooldownProto(c.c)})
	}
	return resp, nil
}
