package statuspatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// BenchmarkStatusWrites is the choice between this package's merge
// patch and server-side apply with a field manager per writer, on the
// same API server: N Proxies each get the lifecycle's Ready write, then
// the health engine's Healthy write, as in a bring-up. The baseline is
// the bare merge patch with optimistic lock that the writers used before
// ownership was declared.
func BenchmarkStatusWrites(b *testing.B) {
	testenv.Require(b)
	const n = 1000
	ctx := context.Background()
	c := env.Client
	ns := env.Namespace(b, "bench")
	var proxies []*v1.Proxy
	for i := range n {
		px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: ns},
			Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: "127.0.0.1", Port: 3128}}
		require.NoError(b, c.Create(ctx, px))
		proxies = append(proxies, px)
	}
	// Each round writes a distinct message, so every write changes something.
	round := 0
	lifecycle := func(px *v1.Proxy) {
		px.Status.Phase, px.Status.IP, px.Status.Port = v1.PhaseReady, "127.0.0.1", 3128
		setCondMsg(px, v1.ConditionReady, v1.ReasonTracking, round)
	}
	health := func(px *v1.Proxy) {
		px.Status.Healthy, px.Status.EgressIP = true, "127.0.0.9"
		setCondMsg(px, v1.ConditionHealthy, v1.ReasonProbeSucceeded, round)
	}
	ways := []struct {
		name  string
		write func(w v1.StatusWriter, px *v1.Proxy, mut func(*v1.Proxy)) error
	}{
		{"bare merge patch (baseline)", func(_ v1.StatusWriter, px *v1.Proxy, mut func(*v1.Proxy)) error {
			base := px.DeepCopy()
			mut(px)
			return c.Status().Patch(ctx, px, locked(base))
		}},
		{"statuspatch.Helper", func(w v1.StatusWriter, px *v1.Proxy, mut func(*v1.Proxy)) error {
			base := px.DeepCopy()
			mut(px)
			_, err := New(w, c).Patch(ctx, base, px)
			return err
		}},
		{"server-side apply", func(w v1.StatusWriter, px *v1.Proxy, mut func(*v1.Proxy)) error {
			mut(px)
			st, err := statusOf(px)
			if err != nil {
				return err
			}
			owned := map[string]any{}
			for f, v := range st {
				if f != "conditions" && w.Owns(f) {
					owned[f] = v
				}
			}
			var conds []any
			for t, cnd := range conditionsOf(st) {
				if w.OwnsCondition(t) {
					conds = append(conds, cnd)
				}
			}
			owned["conditions"] = conds
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": v1.GroupVersion.String(), "kind": "Proxy",
				"metadata": map[string]any{"name": px.Name, "namespace": px.Namespace},
				"status":   owned,
			}}
			//nolint:staticcheck // client.Apply on a subresource is what is measured here
			return c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(w.Name), client.ForceOwnership)
		}},
	}
	var base time.Duration
	for _, way := range ways {
		b.Run(way.name, func(b *testing.B) {
			var took time.Duration
			for b.Loop() {
				round++
				start := time.Now()
				for _, px := range proxies {
					// A merge patch leaves px as the API server answered,
					// the next write's base; apply needs no base.
					require.NoError(b, way.write(v1.WriterLifecycle, px, lifecycle))
					require.NoError(b, way.write(v1.WriterHealth, px, health))
				}
				took += time.Since(start)
			}
			per := took / time.Duration(b.N*2*n)
			if base == 0 {
				base = per
			}
			b.ReportMetric(float64(per.Microseconds()), "µs/write")
			b.ReportMetric(float64(per)/float64(base), "x-baseline")
		})
	}
}

func setCondMsg(px *v1.Proxy, typ, reason string, round int) {
	setCond(px, typ, metav1.ConditionTrue, reason)
	for i := range px.Status.Conditions {
		if px.Status.Conditions[i].Type == typ {
			px.Status.Conditions[i].Message = fmt.Sprintf("round %d", round)
		}
	}
}
