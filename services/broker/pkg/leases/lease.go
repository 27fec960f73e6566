package leases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// attempts bounds how often CreateLease retries after finding the store
// out of step with the inventory (an index to rebuild, a proxy that just
// stopped being leasable).
const attempts = 3

// CreateLease serves LeaseService.CreateLease for c.
func (s *Service) CreateLease(ctx context.Context, c access.Caller, req *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	ttl, err := s.ttl(req.GetTtlSeconds())
	if err := firstErr(err, checkSelector(req.GetSelector()), checkNamespace(req.GetNamespace()), checkTarget(req.GetTarget()),
		checkRequestID(req.GetRequestId()), checkSessionKey(req.GetSessionKey())); err != nil {
		return nil, err
	}
	if err := s.checkSynced(); err != nil {
		return nil, err
	}
	t := c.Tenant
	ns, labels, err := t.Scope(req.GetNamespace(), req.GetSelector())
	if err != nil {
		return nil, err
	}
	sel := index.Selector{Namespaces: ns, Labels: labels}
	target := strings.ToLower(req.GetTarget())
	leases := access.LimitOf(t.Quotas.MaxLeases, "maxLeases", s.cfg.TokenMaxLeases, "--token-max-leases")
	perMinute := access.LimitOf(t.Quotas.LeasesPerMinute, "leasesPerMinute", 0, "")
	a := store.Acquire{Target: target, Cap: s.cfg.LeaseCap, TTL: ttl, LeaseID: store.NewLeaseID(), RequestID: t.Scoped(req.GetRequestId()),
		PerTarget: s.cfg.BanAware, Session: t.Scoped(req.GetSessionKey()), Caller: t.Name, CallerCap: leases.N, CallerRate: perMinute.N}
	if err := s.selectors.take(t, sel, access.LimitOf(t.Quotas.MaxSelectors, "maxSelectors", s.cfg.TokenMaxSelectors, "--token-max-selectors"), s.idx.Holds); err != nil {
		return nil, err
	}
	if a.PerTarget {
		a.TargetCap = s.pol.For(target).MaxConcurrentLeases
	}
	if a.RequestID != "" {
		// What a request id's retries must repeat: the selector (its index
		// key is a canonical hash of it), the target, the TTL and the session.
		a.Fingerprint = fmt.Sprintf("%s %q %d %q", sel.Key(), target, req.GetTtlSeconds(), a.Session)
	}
	for range attempts {
		if a.Index, err = s.idx.Ensure(ctx, sel); err != nil {
			return nil, storeError(err)
		}
		l, err := s.store.Acquire(ctx, a)
		var stale *store.StaleIndexError
		var none *store.NoCandidateError
		switch {
		case errors.Is(err, store.ErrNoIndex):
			s.idx.Forget(a.Index)
			continue
		case errors.As(err, &stale):
			s.idx.Forget(a.Index) // the rebuild re-adds its cooling members
			continue
		case errors.As(err, &none) && none.Candidates == 0:
			if err := s.explainEmpty(ctx, sel, none); err != nil {
				return nil, storeError(err)
			}
			return nil, storeError(none)
		case errors.As(err, &none):
			// Demand the fleet did not meet: pools with autoscaling grow
			// on it. Counting is best effort; the refusal stands.
			if err := s.store.Refused(ctx, a.Index, s.cfg.Clock.Now()); err != nil {
				refusalsUncounted.Inc()
			}
			return nil, storeError(none)
		case err != nil:
			return nil, storeErrorFrom(err, leases, perMinute)
		}
		p, ok := s.inv.Get(l.Proxy)
		if ok && p.Leasable {
			leasesCreated.Inc()
			return &leasev1.CreateLeaseResponse{LeaseId: l.ID, Proxy: toProto(p, store.State{Load: l.Load}), ExpiresAt: timestamppb.New(l.Expires),
				Credentials: s.credentials(ctx, p), SessionMoved: l.SessionMoved}, nil
		}
		// The index still holds a proxy this broker has seen leave the
		// leasable set: hand the lease back, fix the index, pick again.
		if _, err := s.store.Release(ctx, l.ID, t.Name); err != nil {
			return nil, storeError(err)
		}
		if err := s.idx.Apply(ctx, l.Proxy); err != nil {
			return nil, storeError(err)
		}
		a.LeaseID = store.NewLeaseID()
	}
	return nil, status.Error(codes.Unavailable, "the lease store and this broker's view of the fleet disagree; retry")
}

// explainEmpty says why an index is empty: it runs only when no proxy
// matched, to count the matching proxies whose health is stale (probing
// stopped) and the leasable ones in quarantine.
func (s *Service) explainEmpty(ctx context.Context, sel index.Selector, none *store.NoCandidateError) error {
	var leasable []string
	for _, p := range s.inv.Select(sel.Namespaces, sel.Labels, nil, false) {
		if p.HealthStale {
			none.Stale++
		}
		if p.Leasable {
			leasable = append(leasable, p.UID)
		}
	}
	states, err := s.store.States(ctx, "", "", leasable)
	for _, st := range states {
		if !st.QuarantinedUntil.IsZero() {
			none.Quarantined++
		}
	}
	return err
}

// credentials are what the leased proxy asks for, when this broker may
// hand them out. A Secret it cannot read leaves them out: the proxy
// answers 407, as its probes do, which marks it unhealthy soon enough.
func (s *Service) credentials(ctx context.Context, p inventory.Proxy) *leasev1.ProxyCredentials {
	if !s.cfg.ShareCredentials {
		return nil
	}
	c, err := s.inv.Credentials.Of(ctx, p.CredentialsRef)
	if err != nil {
		slog.WarnContext(ctx, "leasing without the proxy's credentials", "proxy", p.ID, "err", err)
		return nil
	}
	if c.Empty() {
		return nil
	}
	return &leasev1.ProxyCredentials{Username: c.Username, Password: c.Password}
}
