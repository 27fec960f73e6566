package leases_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

func cordon(t *testing.T, ns, name string, on bool) {
	update(t, ns, name, false, func(px *v1.Proxy) {
		if on {
			px.Annotations = map[string]string{v1.AnnotationCordoned: "true"}
		} else {
			delete(px.Annotations, v1.AnnotationCordoned)
		}
	})
}

// TestACordonedProxyKeepsItsLeasesAndTakesNoNewOne: cordon stops new
// leases and nothing else; its live lease renews as before, list and
// explain say why it is not leased, and uncordon gives it back.
func TestACordonedProxyKeepsItsLeasesAndTakesNoNewOne(t *testing.T) {
	s, svc := newService(t)
	p := s.Proxy(t, "p", "127.0.0.73", nil)
	ctx := context.Background()
	l, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{TtlSeconds: 60})
	require.NoError(t, err)

	cordon(t, s.NS, "p", true)
	require.Eventually(t, func() bool { q, _ := s.Inv.Get(p.UID); return q.Cordoned }, 10*time.Second, 10*time.Millisecond)
	_, err = svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{})
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "no new lease on a cordoned proxy: %v", err)
	r, err := svc.RenewLease(ctx, access.Anonymous, &leasev1.RenewLeaseRequest{LeaseId: l.GetLeaseId(), TtlSeconds: 300})
	require.NoError(t, err, "its live lease renews")
	assert.WithinDuration(t, time.Now().Add(300*time.Second), r.GetExpiresAt().AsTime(), 5*time.Second, "with no deadline")

	list, err := svc.ListProxies(ctx, access.Anonymous, &leasev1.ListProxiesRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetProxies(), 1)
	assert.Equal(t, "PROXY_CORDONED", list.GetProxies()[0].GetNotLeasable())
	ex, err := svc.ExplainProxy(ctx, access.Anonymous, &leasev1.ExplainProxyRequest{Id: p.ID})
	require.NoError(t, err)
	assert.True(t, ex.GetCordoned())
	assert.EqualValues(t, 1, ex.GetProxy().GetLeaseCount())

	cordon(t, s.NS, "p", false)
	require.Eventually(t, func() bool {
		_, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{})
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "uncordoned, it is leased again")
}

// TestTheOperatorsReads: ListLeases, ExplainProxy and ExplainTarget show a
// tenant its own leases and cooldowns beside the fleet's, and a tenant
// with inspect every tenant's; a proxy outside the caller's namespaces is
// not found, and bad arguments name the field.
func TestTheOperatorsReads(t *testing.T) {
	s, svc := newService(t)
	a := s.Proxy(t, "a", "127.0.0.74", nil)
	s.Proxy(t, "b", "127.0.0.75", nil)
	ns := []string{s.NS}
	alice := access.Caller{Tenant: &access.Tenant{Name: "alice", Namespaces: ns, Verbs: []access.Verb{access.List, access.Lease, access.Report}}}
	bob := access.Caller{Tenant: &access.Tenant{Name: "bob", Namespaces: ns, Trusted: true, Verbs: []access.Verb{access.List, access.Lease, access.Report}}}
	ops := access.Caller{Tenant: &access.Tenant{Name: "ops", Namespaces: ns, Verbs: []access.Verb{access.List, access.Inspect}}}
	outsider := access.Caller{Tenant: &access.Tenant{Name: "out", Namespaces: []string{"elsewhere"}, Verbs: []access.Verb{access.List, access.Inspect}}}

	la, err := svc.CreateLease(context.Background(), alice, &leasev1.CreateLeaseRequest{Target: "shop.example", SessionKey: "cart-1"})
	require.NoError(t, err)
	lb, err := svc.CreateLease(context.Background(), bob, &leasev1.CreateLeaseRequest{Target: "news.example"})
	require.NoError(t, err)
	// alice is untrusted: her block cools the proxy for her alone.
	_, err = svc.ReportLease(context.Background(), alice, &leasev1.ReportLeaseRequest{LeaseId: la.GetLeaseId(), Result: "blocked", StatusCode: 403})
	require.NoError(t, err)
	// bob is trusted: his report cools his proxy for everyone.
	_, err = svc.ReportLease(context.Background(), bob, &leasev1.ReportLeaseRequest{LeaseId: lb.GetLeaseId(), Result: "rate_limited", Target: "news.example", StatusCode: 429})
	require.NoError(t, err)

	ids := func(ls []*leasev1.Lease) (out []string) {
		for _, l := range ls {
			out = append(out, l.GetTenant()+":"+l.GetTarget())
		}
		return out
	}
	mine, err := svc.ListLeases(context.Background(), alice, &leasev1.ListLeasesRequest{})
	require.NoError(t, err)
	assert.Equal(t, []string{"alice:shop.example"}, ids(mine.GetLeases()), "a tenant sees its own leases")
	assert.Equal(t, "cart-1", mine.GetLeases()[0].GetSessionKey(), "with its session key as it gave it")
	all, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"alice:shop.example", "bob:news.example"}, ids(all.GetLeases()), "inspect sees every tenant's")
	one, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{Tenant: "bob"})
	require.NoError(t, err)
	assert.Equal(t, []string{"bob:news.example"}, ids(one.GetLeases()))
	paged, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{PageSize: 1})
	require.NoError(t, err)
	require.Len(t, paged.GetLeases(), 1)
	require.NotEmpty(t, paged.GetNextPageToken())
	rest, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{PageSize: 1, PageToken: paged.GetNextPageToken()})
	require.NoError(t, err)
	assert.ElementsMatch(t, ids(all.GetLeases()), append(ids(paged.GetLeases()), ids(rest.GetLeases())...), "two pages hold both leases once")
	assert.Empty(t, rest.GetNextPageToken())
	none, err := svc.ListLeases(context.Background(), outsider, &leasev1.ListLeasesRequest{})
	require.NoError(t, err)
	assert.Empty(t, none.GetLeases(), "nothing outside the caller's namespaces")

	ex, err := svc.ExplainProxy(context.Background(), ops, &leasev1.ExplainProxyRequest{Id: la.GetProxy().GetId()})
	require.NoError(t, err)
	require.Len(t, ex.GetCooldowns(), 1)
	assert.Equal(t, "shop.example", ex.GetCooldowns()[0].GetTarget())
	assert.Equal(t, "alice", ex.GetCooldowns()[0].GetTenant(), "a cooldown for alice alone says so")
	assert.True(t, ex.GetCooldowns()[0].GetUntil().AsTime().After(time.Now()))
	exBob, err := svc.ExplainProxy(context.Background(), bob, &leasev1.ExplainProxyRequest{Id: la.GetProxy().GetId()})
	require.NoError(t, err)
	assert.Empty(t, exBob.GetCooldowns(), "bob does not see alice's own cooldown")

	tgt, err := svc.ExplainTarget(context.Background(), ops, &leasev1.ExplainTargetRequest{Target: "News.Example"})
	require.NoError(t, err)
	assert.Equal(t, "news.example", tgt.GetTarget())
	assert.EqualValues(t, 2, tgt.GetProxies())
	assert.EqualValues(t, 1, tgt.GetLeases())
	require.Len(t, tgt.GetCooling(), 1)
	assert.Equal(t, lb.GetProxy().GetId(), tgt.GetCooling()[0].GetProxyId())
	assert.Empty(t, tgt.GetCooling()[0].GetCooldown().GetTenant(), "bob is trusted here: the fleet's cooldown")
	assert.EqualValues(t, 0, tgt.GetCooling()[0].GetCooldown().GetLevel())

	// Without inspect, a tenant counts only its own leases on a target:
	// whether another tenant crawls it is not its business.
	forAlice, err := svc.ExplainTarget(context.Background(), alice, &leasev1.ExplainTargetRequest{Target: "news.example"})
	require.NoError(t, err)
	assert.EqualValues(t, 0, forAlice.GetLeases(), "bob's lease is not counted for alice")
	assert.Zero(t, forAlice.GetPacePerSecond())
	forBob, err := svc.ExplainTarget(context.Background(), bob, &leasev1.ExplainTargetRequest{Target: "news.example"})
	require.NoError(t, err)
	assert.EqualValues(t, 1, forBob.GetLeases(), "bob counts his own")

	_, err = svc.ExplainProxy(context.Background(), outsider, &leasev1.ExplainProxyRequest{Id: a.ID})
	assert.Equal(t, codes.NotFound, status.Code(err), "a proxy outside the caller's scope is not found: %v", err)
	for _, tc := range []struct {
		call  func() error
		field string
	}{
		{func() error {
			_, err := svc.ExplainProxy(context.Background(), ops, &leasev1.ExplainProxyRequest{Id: "no-slash"})
			return err
		}, "id"},
		{func() error {
			_, err := svc.ExplainTarget(context.Background(), ops, &leasev1.ExplainTargetRequest{})
			return err
		}, "target"},
		{func() error {
			_, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{ProxyId: "x"})
			return err
		}, "id"},
		{func() error {
			_, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{PageSize: -1})
			return err
		}, "page_size"},
		{func() error {
			_, err := svc.ListLeases(context.Background(), ops, &leasev1.ListLeasesRequest{Tenant: "Not A Name"})
			return err
		}, "tenant"},
	} {
		err := tc.call()
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), tc.field)
	}
}
