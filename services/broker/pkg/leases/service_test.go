package leases_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/broker/internal/brokertest"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func newService(t *testing.T) (*brokertest.Stack, *leases.Service) {
	s := brokertest.New(t, env, nil)
	return s, leases.New(s.Inv, s.Store, s.Index, &policy.Policies{Defaults: leases.DefaultPolicy}, leases.DefaultConfig)
}

func reasonOf(err error) (codes.Code, string) {
	st := status.Convert(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return st.Code(), info.GetReason()
		}
	}
	return st.Code(), ""
}

func update(t *testing.T, ns, name string, status bool, mutate func(*v1.Proxy)) {
	t.Helper()
	ctx := context.Background()
	var px v1.Proxy
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &px))
	mutate(&px)
	if status {
		require.NoError(t, env.Client.Status().Update(ctx, &px))
	} else {
		require.NoError(t, env.Client.Update(ctx, &px))
	}
}

// TestRenewRefusedOnceTheProxyLeavesTheLeasableSet: a lease is renewed
// only while its proxy is leasable at the address it was leased at.
func TestRenewRefusedOnceTheProxyLeavesTheLeasableSet(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, ns string)
		reason string
		// moved: the proxy is still leasable, at its new address.
		moved bool
	}{
		{"unhealthy", func(t *testing.T, ns string) {
			update(t, ns, "p", true, func(px *v1.Proxy) {
				px.Status.Healthy = false
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1.ReasonProbeFailed, Message: "t"})
			})
		}, "PROXY_UNHEALTHY", false},
		{"health stale", func(t *testing.T, ns string) {
			update(t, ns, "p", true, func(px *v1.Proxy) {
				px.Status.Healthy = false
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: v1.ReasonProbeStale, Message: "t"})
			})
		}, "PROXY_HEALTH_STALE", false},
		{"address changed", func(t *testing.T, ns string) {
			update(t, ns, "p", true, func(px *v1.Proxy) { px.Status.IP = "127.0.0.99" })
		}, "PROXY_ADDRESS_CHANGED", true},
		{"deleting", func(t *testing.T, ns string) {
			update(t, ns, "p", false, func(px *v1.Proxy) { px.Finalizers = append(px.Finalizers, "test.example.com/hold") })
			require.NoError(t, env.Client.Delete(context.Background(), &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}))
			t.Cleanup(func() {
				update(t, ns, "p", false, func(px *v1.Proxy) { px.Finalizers = nil })
			})
		}, "PROXY_DELETING", false},
		{"drain deadline passed", func(t *testing.T, ns string) {
			drain(t, ns, "p", time.Now().Add(-time.Second).Format(time.RFC3339))
		}, "PROXY_DRAINING", false},
		{"drain annotation not a time", func(t *testing.T, ns string) {
			drain(t, ns, "p", "soon")
		}, "PROXY_DRAINING", false},
		{"deleted", func(t *testing.T, ns string) {
			require.NoError(t, env.Client.Delete(context.Background(), &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}))
		}, "PROXY_GONE", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, svc := newService(t)
			p := s.Proxy(t, "p", "127.0.0.71", nil)
			ctx := context.Background()
			l, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{})
			require.NoError(t, err)
			_, err = svc.RenewLease(ctx, access.Anonymous, &leasev1.RenewLeaseRequest{LeaseId: l.GetLeaseId()})
			require.NoError(t, err)

			tc.change(t, s.NS)
			require.Eventually(t, func() bool {
				q, ok := s.Inv.Get(p.UID)
				return !ok || !q.Leasable || q.Addr() != p.Addr()
			}, 10*time.Second, 10*time.Millisecond)
			_, err = svc.RenewLease(ctx, access.Anonymous, &leasev1.RenewLeaseRequest{LeaseId: l.GetLeaseId()})
			code, reason := reasonOf(err)
			if tc.reason == "PROXY_GONE" && code == codes.NotFound {
				// The broker ended the lease with its proxy (decision 89)
				// before this renewal: unknown, as the API says.
				reason, code = "PROXY_GONE", codes.FailedPrecondition
			}
			assert.Equal(t, codes.FailedPrecondition, code, "%v", err)
			assert.Equal(t, tc.reason, reason, "%v", err)

			l2, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{})
			if tc.moved {
				require.NoError(t, err)
				assert.Equal(t, "127.0.0.99", l2.GetProxy().GetIp(), "a new lease gets the new address")
				return
			}
			code, _ = reasonOf(err)
			assert.Equal(t, codes.ResourceExhausted, code, "no other proxy to lease: %v", err)
		})
	}
}

func drain(t *testing.T, ns, name, deadline string) {
	update(t, ns, name, false, func(px *v1.Proxy) {
		px.Annotations = map[string]string{v1.AnnotationDrainDeadline: deadline}
	})
}

// TestADrainingProxyKeepsItsLeasesUntilTheDeadline: a draining proxy is
// leased to nobody new, and its live lease renews only up to the drain
// deadline, so the pool deletes it without cutting a lease short.
func TestADrainingProxyKeepsItsLeasesUntilTheDeadline(t *testing.T) {
	s, svc := newService(t)
	p := s.Proxy(t, "p", "127.0.0.72", nil)
	ctx := context.Background()
	l, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{TtlSeconds: 60})
	require.NoError(t, err)

	deadline := time.Now().Add(20 * time.Second).Truncate(time.Second)
	drain(t, s.NS, "p", deadline.Format(time.RFC3339))
	require.Eventually(t, func() bool { q, _ := s.Inv.Get(p.UID); return q.Draining() }, 10*time.Second, 10*time.Millisecond)

	_, err = svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{})
	code, _ := reasonOf(err)
	assert.Equal(t, codes.ResourceExhausted, code, "no new lease on a draining proxy: %v", err)

	r, err := svc.RenewLease(ctx, access.Anonymous, &leasev1.RenewLeaseRequest{LeaseId: l.GetLeaseId(), TtlSeconds: 300})
	require.NoError(t, err, "a live lease still renews while the proxy drains")
	assert.WithinDuration(t, deadline, r.GetExpiresAt().AsTime(), time.Second, "but not past the drain deadline")

	list, err := svc.ListProxies(ctx, access.Anonymous, &leasev1.ListProxiesRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetProxies(), 1)
	assert.EqualValues(t, 1, list.GetProxies()[0].GetLeaseCount(), "the broker still counts the draining proxy's lease")
}

func TestCreateLeaseRequestID(t *testing.T) {
	s, svc := newService(t)
	s.Proxy(t, "a", "127.0.0.81", nil)
	s.Proxy(t, "b", "127.0.0.82", nil)
	ctx := context.Background()
	req := &leasev1.CreateLeaseRequest{RequestId: "9b2f6d0e-2c1f-4f7e-9d55-0d7a1c3e5b21", Target: "example.com"}
	first, err := svc.CreateLease(ctx, access.Anonymous, req)
	require.NoError(t, err)
	again, err := svc.CreateLease(ctx, access.Anonymous, req)
	require.NoError(t, err)
	assert.Equal(t, first.GetLeaseId(), again.GetLeaseId())
	assert.Equal(t, first.GetProxy().GetId(), again.GetProxy().GetId())
	assert.EqualValues(t, 1, again.GetProxy().GetLeaseCount())

	other := &leasev1.CreateLeaseRequest{RequestId: req.RequestId, Target: "example.org"}
	_, err = svc.CreateLease(ctx, access.Anonymous, other)
	assert.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)

	_, err = svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{RequestId: "not valid!"})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "requestId")
}

// TestCreateLeaseNeverHandsOutAnUnleasableProxy: when the store's index
// still holds a proxy this broker knows is not leasable (another broker,
// behind, put it back), CreateLease hands the lease back and picks again.
func TestCreateLeaseNeverHandsOutAnUnleasableProxy(t *testing.T) {
	s, svc := newService(t)
	good := s.Proxy(t, "good", "127.0.0.91", nil)
	bad := s.Proxy(t, "bad", "127.0.0.92", nil)
	ctx := context.Background()
	first, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{}) // builds the index
	require.NoError(t, err)
	_, err = svc.ReleaseLease(ctx, access.Anonymous, &leasev1.ReleaseLeaseRequest{LeaseId: first.GetLeaseId()})
	require.NoError(t, err)
	update(t, s.NS, "bad", true, func(px *v1.Proxy) { px.Status.Healthy = false })
	require.Eventually(t, func() bool { q, _ := s.Inv.Get(bad.UID); return !q.Leasable }, 10*time.Second, 10*time.Millisecond)
	for range 20 {
		// A lagging broker's view: bad is leasable, and it is least loaded.
		for _, key := range indexKeys(t, s) {
			require.NoError(t, s.Store.Join(ctx, "", []store.Member{{UID: bad.UID, Namespace: s.NS, Addr: bad.Addr()}}, []string{key}))
		}
		l, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{})
		require.NoError(t, err)
		assert.Equal(t, good.ID, l.GetProxy().GetId())
		assert.NotEmpty(t, l.GetProxy().GetIp())
		_, err = svc.ReleaseLease(ctx, access.Anonymous, &leasev1.ReleaseLeaseRequest{LeaseId: l.GetLeaseId()})
		require.NoError(t, err)
	}
	states, err := s.Store.States(ctx, "", "", []string{bad.UID})
	require.NoError(t, err)
	assert.Zero(t, states[bad.UID].Load, "every lease on bad was handed back")
}

func indexKeys(t *testing.T, s *brokertest.Stack) []string {
	ixs, err := s.Store.Indexes(context.Background())
	require.NoError(t, err)
	var out []string
	for k := range ixs {
		out = append(out, k)
	}
	return out
}

// TestRecreatedProxyStartsClean: a Proxy deleted and created again under
// the same name has a new UID, so it inherits neither leases nor
// cooldowns, and the old one's state is dropped.
func TestRecreatedProxyStartsClean(t *testing.T) {
	s, svc := newService(t)
	old := s.Proxy(t, "p", "127.0.0.95", nil)
	ctx := context.Background()
	l, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{Target: "example.com"})
	require.NoError(t, err)
	_, err = svc.ReportLease(ctx, access.Anonymous, &leasev1.ReportLeaseRequest{LeaseId: l.GetLeaseId(), Result: "rate_limited"})
	require.NoError(t, err)
	_, err = svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{Target: "example.com"})
	code, reason := reasonOf(err)
	require.Equal(t, codes.ResourceExhausted, code)
	require.Equal(t, "ALL_COOLING_DOWN", reason)

	require.NoError(t, env.Client.Delete(ctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: "p"}}))
	require.Eventually(t, func() bool { _, ok := s.Inv.Get(old.UID); return !ok }, 10*time.Second, 10*time.Millisecond)
	fresh := s.Proxy(t, "p", "127.0.0.95", nil)
	require.NotEqual(t, old.UID, fresh.UID)

	l2, err := svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{Target: "example.com"})
	require.NoError(t, err, "the new proxy does not inherit the cooldown")
	assert.EqualValues(t, 1, l2.GetProxy().GetLeaseCount(), "nor the old lease")
	// The old lease cannot be renewed: PROXY_GONE while the broker has
	// not yet ended it, unknown (404) once it has.
	_, err = svc.RenewLease(ctx, access.Anonymous, &leasev1.RenewLeaseRequest{LeaseId: l.GetLeaseId()})
	code, reason = reasonOf(err)
	assert.True(t, reason == "PROXY_GONE" || code == codes.NotFound, "%v", err)
	require.Eventually(t, func() bool {
		known, err := s.Store.Known(ctx)
		require.NoError(t, err)
		_, ok := known[old.UID]
		return !ok
	}, 10*time.Second, 10*time.Millisecond, "the old proxy's state is gone")
	_, err = svc.RenewLease(ctx, access.Anonymous, &leasev1.RenewLeaseRequest{LeaseId: l.GetLeaseId()})
	code, _ = reasonOf(err)
	assert.Equal(t, codes.NotFound, code, "its lease ended with it")
}

// TestListRefusalsCountsUnmetDemand: leases refused because every match
// was at its cap are counted per selector, across calls; a selector
// matching nothing is not demand a pool could meet.
func TestListRefusalsCountsUnmetDemand(t *testing.T) {
	s := brokertest.New(t, env, nil)
	cfg := leases.DefaultConfig
	cfg.LeaseCap = 1
	clk := clocktesting.NewFakeClock(time.Now())
	cfg.Clock = clk
	svc := leases.New(s.Inv, s.Store, s.Index, &policy.Policies{Defaults: leases.DefaultPolicy}, cfg)
	s.Proxy(t, "p", "127.0.0.73", map[string]string{"geo": "eu"})
	ctx := context.Background()
	eu := &leasev1.CreateLeaseRequest{Selector: map[string]string{"geo": "eu"}, Namespace: s.NS}
	_, err := svc.CreateLease(ctx, access.Anonymous, eu)
	require.NoError(t, err)
	for range 3 {
		_, err = svc.CreateLease(ctx, access.Anonymous, eu)
		_, reason := reasonOf(err)
		require.Equal(t, "ALL_AT_CAP", reason)
	}
	_, err = svc.CreateLease(ctx, access.Anonymous, &leasev1.CreateLeaseRequest{Selector: map[string]string{"geo": "us"}})
	_, reason := reasonOf(err)
	require.Equal(t, "NO_MATCHING_PROXY", reason)

	got, err := svc.ListRefusals(ctx, access.Anonymous, &leasev1.ListRefusalsRequest{})
	require.NoError(t, err)
	require.Len(t, got.GetSelectors(), 1, "%v", got)
	assert.Equal(t, s.NS, got.GetSelectors()[0].GetNamespace())
	assert.Equal(t, map[string]string{"geo": "eu"}, got.GetSelectors()[0].GetSelector())
	assert.EqualValues(t, 3, got.GetSelectors()[0].GetRefused())

	// Counted by the minute: two minutes on, a one-minute window holds
	// none of them, a five-minute one all three.
	clk.Step(2 * time.Minute)
	got, err = svc.ListRefusals(ctx, access.Anonymous, &leasev1.ListRefusalsRequest{WindowSeconds: 60})
	require.NoError(t, err)
	assert.Empty(t, got.GetSelectors(), "the refusals left the window")
	got, err = svc.ListRefusals(ctx, access.Anonymous, &leasev1.ListRefusalsRequest{WindowSeconds: 300})
	require.NoError(t, err)
	require.Len(t, got.GetSelectors(), 1)
	assert.EqualValues(t, 3, got.GetSelectors()[0].GetRefused())

	_, err = svc.ListRefusals(ctx, access.Anonymous, &leasev1.ListRefusalsRequest{WindowSeconds: 601})
	assert.Equal(t, codes.InvalidArgument, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "windowSeconds")
}
