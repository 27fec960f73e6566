package statuspatch

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// statusKinds maps each declared kind to its status type, for the
// declarations to be held to the fields that exist.
var statusKinds = map[string]reflect.Type{
	"Proxy":       reflect.TypeFor[v1.ProxyStatus](),
	"ProxyPool":   reflect.TypeFor[v1.ProxyPoolStatus](),
	"ProxySource": reflect.TypeFor[v1.ProxySourceStatus](),
	"Tenant":      reflect.TypeFor[v1.TenantStatus](),
}

func jsonFields(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	return out
}

// Every status field and condition type has exactly one writer, and
// every declared field exists.
func TestEveryStatusFieldHasOneWriter(t *testing.T) {
	for kind, typ := range statusKinds {
		owners := map[string][]string{}
		conds := map[string][]string{}
		for _, w := range v1.StatusWriters {
			if w.Kind != kind {
				continue
			}
			for _, f := range jsonFields(typ) {
				if w.Owns(f) {
					owners[f] = append(owners[f], w.Name)
				}
			}
			for _, f := range w.Fields {
				assert.True(t, f == v1.AllFields || contains(jsonFields(typ), f), "%s declares %s.status.%s, which does not exist", w.Name, kind, f)
			}
			for _, c := range w.Conditions {
				conds[c] = append(conds[c], w.Name)
			}
		}
		for _, f := range jsonFields(typ) {
			if f == "conditions" && len(conds) > 0 {
				continue // owned per type, below
			}
			assert.Len(t, owners[f], 1, "%s.status.%s must have one writer, has %v", kind, f, owners[f])
		}
		for c, ws := range conds {
			assert.Len(t, ws, 1, "%s condition %s must have one writer, has %v", kind, c, ws)
		}
	}
	for _, w := range v1.StatusWriters {
		assert.Contains(t, statusKinds, w.Kind, "writer %s writes a kind this test does not know", w.Name)
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func proxyWith(mut func(*v1.Proxy)) *v1.Proxy {
	px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Generation: 2}}
	px.Status.Phase = v1.PhaseReady
	px.Status.Conditions = []metav1.Condition{
		{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonRunning},
		{Type: v1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: v1.ReasonNotProbed},
	}
	if mut != nil {
		mut(px)
	}
	return px
}

func setCond(px *v1.Proxy, typ string, st metav1.ConditionStatus, reason string) {
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: typ, Status: st, Reason: reason})
}

func TestAWriteOutsideTheDeclarationIsRefused(t *testing.T) {
	cases := []struct {
		name    string
		writer  v1.StatusWriter
		mut     func(*v1.Proxy)
		changed bool
		refused string // the field named, "" when allowed
	}{
		{"nothing changed", v1.WriterLifecycle, nil, false, ""},
		{"lifecycle moves the phase", v1.WriterLifecycle, func(p *v1.Proxy) { p.Status.Phase = v1.PhaseDeleting }, true, ""},
		{"lifecycle sets Ready", v1.WriterLifecycle, func(p *v1.Proxy) { setCond(p, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonReplacing) }, true, ""},
		{"lifecycle observes", v1.WriterLifecycle, func(p *v1.Proxy) { p.Observe() }, true, ""},
		{"lifecycle sets healthy", v1.WriterLifecycle, func(p *v1.Proxy) { p.Status.Healthy = true }, false, "healthy"},
		{"lifecycle sets Healthy", v1.WriterLifecycle, func(p *v1.Proxy) { setCond(p, v1.ConditionHealthy, metav1.ConditionTrue, v1.ReasonProbeSucceeded) }, false, "conditions[Healthy]"},
		{"lifecycle drops Healthy", v1.WriterLifecycle, func(p *v1.Proxy) { meta.RemoveStatusCondition(&p.Status.Conditions, v1.ConditionHealthy) }, false, "conditions[Healthy]"},
		{"health sets Healthy and egressIP", v1.WriterHealth, func(p *v1.Proxy) {
			setCond(p, v1.ConditionHealthy, metav1.ConditionTrue, v1.ReasonProbeSucceeded)
			p.Status.EgressIP = "127.0.0.9"
		}, true, ""},
		{"health moves the phase", v1.WriterHealth, func(p *v1.Proxy) { p.Status.Phase = v1.PhaseFailed }, false, "phase"},
		{"health clears the address", v1.WriterHealth, func(p *v1.Proxy) { p.Status.IP = ""; p.Status.InstanceGeneration = 3 }, false, "instanceGeneration"},
		{"health sets Ready", v1.WriterHealth, func(p *v1.Proxy) { setCond(p, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonDeleting) }, false, "conditions[Ready]"},
		{"a writer of another kind", v1.WriterPool, func(p *v1.Proxy) { p.Status.Phase = v1.PhaseFailed }, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := proxyWith(func(p *v1.Proxy) { p.Status.IP = "127.0.0.1"; p.Status.InstanceGeneration = 1 })
			obj := base.DeepCopy()
			if tc.mut != nil {
				tc.mut(obj)
			}
			old, err := statusOf(base)
			require.NoError(t, err)
			cur, err := statusOf(obj)
			require.NoError(t, err)
			changed, err := New(tc.writer, nil).check(old, cur)
			if tc.refused == "" {
				require.NoError(t, err)
				assert.Equal(t, tc.changed, changed)
				return
			}
			require.True(t, IsNotOwned(err), "want a refusal, got %v", err)
			var no *NotOwnedError
			require.True(t, errors.As(err, &no))
			assert.Equal(t, tc.refused, no.Field)
			assert.Contains(t, err.Error(), tc.writer.Name)
			// Refused before anything is sent: Patch with no client returns it.
			_, err = New(tc.writer, nil).Patch(context.Background(), base, obj)
			assert.True(t, IsNotOwned(err))
		})
	}
}

func createProxy(t *testing.T, ns string) *v1.Proxy {
	t.Helper()
	px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}, Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: "127.0.0.1", Port: 3128}}
	require.NoError(t, env.Client.Create(context.Background(), px))
	return px
}

// The lifecycle and the health engine share a Proxy's status: a write
// that lost the race to the other's fields is laid on the live object,
// conditions merged per type; one that lost to its own fields is the
// conflict the reconcile must decide again on.
func TestALostRaceMergesPerOwner(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	c := env.Client
	px := createProxy(t, env.Namespace(t, "race"))
	lifecycle, health := New(v1.WriterLifecycle, c), New(v1.WriterHealth, c)

	stale := px.DeepCopy()
	h := px.DeepCopy()
	h.Status.Healthy, h.Status.EgressIP = true, "127.0.0.9"
	setCond(h, v1.ConditionHealthy, metav1.ConditionTrue, v1.ReasonProbeSucceeded)
	wrote, err := health.Patch(ctx, px, h)
	require.NoError(t, err)
	require.True(t, wrote)

	l := stale.DeepCopy()
	l.Status.Phase, l.Status.IP, l.Status.Port = v1.PhaseReady, "127.0.0.1", 3128
	setCond(l, v1.ConditionReady, metav1.ConditionTrue, v1.ReasonTracking)
	wrote, err = lifecycle.Patch(ctx, stale, l)
	require.NoError(t, err, "a race lost to the health engine's fields is written again")
	require.True(t, wrote)

	got := &v1.Proxy{}
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(px), got))
	assert.Equal(t, v1.PhaseReady, got.Status.Phase)
	assert.True(t, got.Status.Healthy)
	assert.Equal(t, "127.0.0.9", got.Status.EgressIP)
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady))
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionHealthy))

	// A field the writer clears is cleared on the live object too: the
	// lifecycle takes the address away after health changed underneath.
	before := got.DeepCopy()
	h2 := got.DeepCopy()
	h2.Status.EgressIP = "127.0.0.10"
	_, err = health.Patch(ctx, got, h2)
	require.NoError(t, err)
	l3 := before.DeepCopy()
	l3.Status.Phase, l3.Status.IP = v1.PhaseProvisioning, ""
	setCond(l3, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonProvisioning)
	_, err = lifecycle.Patch(ctx, before, l3)
	require.NoError(t, err)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(px), got))
	assert.Empty(t, got.Status.IP, "the address the lifecycle cleared is gone")
	assert.Equal(t, "127.0.0.10", got.Status.EgressIP, "and health's write stays")
	assert.False(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady))
	assert.True(t, meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionHealthy))
	stale = got.DeepCopy()

	// The lifecycle again from its stale read: its own phase moved since.
	l1 := stale.DeepCopy()
	l1.Status.Phase = v1.PhaseReady
	_, err = lifecycle.Patch(ctx, stale, l1)
	require.NoError(t, err)
	l2 := stale.DeepCopy()
	l2.Status.Phase = v1.PhaseFailed
	_, err = lifecycle.Patch(ctx, stale, l2)
	assert.True(t, apierrors.IsConflict(err), "a race lost on the writer's own fields is a conflict, got %v", err)
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(px), got))
	assert.Equal(t, v1.PhaseReady, got.Status.Phase, "the stale decision did not land")
}

func TestTheGenerationIsObservedOnlyOnSuccess(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	px := createProxy(t, env.Namespace(t, "observe"))
	pool := New(v1.WriterLifecycle, env.Client)

	for _, failed := range []bool{true, false} {
		cur := &v1.Proxy{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(px), cur))
		base := cur.DeepCopy()
		cur.Status.Phase = v1.PhaseProvisioning
		var res ctrl.Result
		var retErr error
		if failed {
			retErr = errors.New("provider down")
			cur.Status.Phase = v1.PhasePending
		}
		pool.Deferred(ctx, base, cur, &res, &retErr)
		got := &v1.Proxy{}
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(px), got))
		if failed {
			assert.Zero(t, got.Status.ObservedGeneration, "a failed reconcile wrote its status but not the generation")
			assert.Equal(t, v1.PhasePending, got.Status.Phase)
			assert.EqualError(t, retErr, "provider down")
		} else {
			assert.Equal(t, got.Generation, got.Status.ObservedGeneration)
			assert.NoError(t, retErr)
		}
	}
}
