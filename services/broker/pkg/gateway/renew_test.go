package gateway

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// renewLeaser records the renewals asked of it and answers each lease as
// told.
type renewLeaser struct {
	Leaser
	mu     sync.Mutex
	asked  []string
	answer map[string]codes.Code
}

func (l *renewLeaser) RenewLease(_ context.Context, _ access.Caller, r *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, r.LeaseId)
	if c := l.answer[r.LeaseId]; c != codes.OK {
		return nil, status.Error(c, "told so")
	}
	return &leasev1.RenewLeaseResponse{}, nil
}

// revoked is the credentials removed since their tunnels opened: a
// recheck refuses them, as the registry does a removed credential.
type revoked map[string]bool

func (revoked) Enabled() bool                         { return true }
func (revoked) Gateway(string) (access.Caller, error) { return access.Caller{}, nil }
func (r revoked) Recheck(c access.Caller, _ access.Verb) (access.Caller, error) {
	if r[c.Name] {
		return access.Caller{}, status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	return c, nil
}

func (l *renewLeaser) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.asked
	l.asked = nil
	return out
}

// A held lease is renewed once it is a third of its TTL old, not
// before; renewed, it waits another third; one the API
// will not renew ends what holds it, one that failed for a while is
// asked again next round; one whose credential was removed ends without
// being renewed. Time is stepped, so each round sees exactly the leases
// due.
func TestLeasesAreRenewedAtAThirdOfTheirTTL(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC))
	r := &renewer{clock: clk}
	l := &renewLeaser{answer: map[string]codes.Code{"gone": codes.NotFound, "flaky": codes.Unavailable}}
	const ttl = 30 * time.Second
	var mu sync.Mutex
	ended := map[string]bool{}
	// Ending a tunnel drops its lease, as the gateway's tunnel does when
	// its connection closes; renewals run at once, so tunnels end at once.
	hold := func(id string) {
		r.hold(id, access.Caller{Tenant: &access.Tenant{Name: id}}, func() {
			mu.Lock()
			ended[id] = true
			mu.Unlock()
			r.drop(id)
		})
	}
	callers := revoked{"removed": true}
	round := func() []string { r.round(context.Background(), l, callers, ttl); return l.take() }

	hold("a")
	clk.Step(5 * time.Second)
	hold("b")
	hold("gone")
	hold("flaky")
	hold("removed")
	assert.Empty(t, round(), "nothing is a third of its TTL old")

	clk.Step(5*time.Second + time.Millisecond)
	assert.Equal(t, []string{"a"}, round(), "a is 10 s old")

	clk.Step(5 * time.Second)
	assert.ElementsMatch(t, []string{"b", "gone", "flaky"}, round())
	assert.True(t, ended["gone"], "a lease the API will not renew ends its tunnel")
	assert.False(t, ended["flaky"], "a failure that may pass ends nothing")
	assert.True(t, ended["removed"], "a removed credential's tunnel ends at its next renewal, which is not asked for")

	clk.Step(time.Second)
	assert.Equal(t, []string{"flaky"}, round(), "the failed one is asked again; the renewed wait a third of the TTL")

	l.answer["flaky"] = codes.OK
	clk.Step(4*time.Second + time.Millisecond)
	assert.ElementsMatch(t, []string{"a", "flaky"}, round(), "a, renewed over 10 s ago, is due again; flaky is still due; gone is gone")
}
