package leases_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/internal/brokertest"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
)

// One token cannot sink the fleet: its reports count only for the targets
// its leases are for, it holds at most its cap of leases, and its reports
// are rate limited; every refusal names the token, never its secret, and
// leaves other tokens alone.
func TestOneTokenCannotSinkTheFleet(t *testing.T) {
	s := brokertest.New(t, env, nil)
	cfg := leases.DefaultConfig
	// A burst of 3 reports, refilled once in 1000 s: none within the test.
	cfg.TokenMaxLeases, cfg.TokenReportRate, cfg.TokenReportBurst = 2, 0.001, 3
	svc := leases.New(s.Inv, s.Store, s.Index, &policy.Policies{Defaults: leases.DefaultPolicy}, cfg)
	for _, ip := range []string{"127.0.0.111", "127.0.0.112", "127.0.0.113"} {
		s.Proxy(t, "p"+ip[len(ip)-1:], ip, nil)
	}
	greedy := access.Caller{Tenant: &access.Tenant{Name: "greedy"}}
	other := access.Caller{Tenant: &access.Tenant{Name: "other"}}

	l, err := svc.CreateLease(context.Background(), greedy, &leasev1.CreateLeaseRequest{Target: "shop.example"})
	require.NoError(t, err)
	_, err = svc.ReportLease(context.Background(), greedy, &leasev1.ReportLeaseRequest{LeaseId: l.GetLeaseId(), Result: "error", Target: "victim.example"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), `target: the lease is for target "shop.example"`)

	_, err = svc.CreateLease(context.Background(), greedy, &leasev1.CreateLeaseRequest{})
	require.NoError(t, err)
	_, err = svc.CreateLease(context.Background(), greedy, &leasev1.CreateLeaseRequest{})
	code, reason := reasonOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Equal(t, "TOKEN_LEASE_CAP", reason)
	assert.Contains(t, status.Convert(err).Message(), `tenant "greedy" holds 2 live leases, its cap of 2: release some first (--token-max-leases)`)
	lo, err := svc.CreateLease(context.Background(), other, &leasev1.CreateLeaseRequest{})
	assert.NoError(t, err, "another token is not held to greedy's cap")

	// The refused report above took one of the burst; two are left.
	for range 2 {
		_, err = svc.ReportLease(context.Background(), greedy, &leasev1.ReportLeaseRequest{LeaseId: l.GetLeaseId(), Result: "ok"})
		require.NoError(t, err)
	}
	_, err = svc.ReportLease(context.Background(), greedy, &leasev1.ReportLeaseRequest{LeaseId: l.GetLeaseId(), Result: "ok"})
	code, reason = reasonOf(err)
	assert.Equal(t, codes.ResourceExhausted, code)
	assert.Equal(t, "TOKEN_REPORT_RATE", reason)
	_, err = svc.ReportLease(context.Background(), other, &leasev1.ReportLeaseRequest{LeaseId: lo.GetLeaseId(), Result: "ok"})
	assert.NoError(t, err, "the rate is per token")
}
