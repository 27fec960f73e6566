package garbagecollection_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/garbagecollection"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kubernetes"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestSweepCollectsOnlyOrphansPastTheGracePeriod(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ns := env.Namespace(t, "gc")
	entries, err := providers.ParseConfig([]byte(fmt.Sprintf("providers:\n- {name: kubernetes, type: kubernetes, kubernetes: {namespace: %s}}\n", ns)), []string{"kubernetes"})
	require.NoError(t, err)
	reg, err := providers.NewRegistry(ctx, entries, map[string]providers.Factory{"kubernetes": kubernetes.New},
		providers.Deps{Client: env.Client, APIReader: env.Client, Log: slog.Default()})
	require.NoError(t, err)
	prov, err := reg.Get("kubernetes")
	require.NoError(t, err)

	// A live Proxy whose status says it is on instance generation 2.
	live := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "live", Namespace: ns}, Spec: v1.ProxySpec{Provider: "kubernetes"}}
	require.NoError(t, env.Client.Create(ctx, live))
	live.Status.InstanceGeneration = 2
	require.NoError(t, env.Client.Status().Update(ctx, live))
	// A Proxy that is gone (deleted), and one recreated under an old name.
	gone := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "gone", Namespace: ns}, Spec: v1.ProxySpec{Provider: "kubernetes"}}
	require.NoError(t, env.Client.Create(ctx, gone))
	require.NoError(t, env.Client.Delete(ctx, gone))

	mk := func(name string, uid types.UID, owner string, gen int64) string {
		inst, err := prov.Create(ctx, &providers.CreateRequest{Name: name, Port: 3128,
			Owner: providers.Owner{UID: uid, Namespace: ns, Name: owner, Generation: gen}})
		require.NoError(t, err)
		return inst.ProviderID
	}
	orphanDeleted := mk("orphan-deleted-owner", gone.UID, "gone", 1)
	orphanRenamed := mk("orphan-reused-name", uuid.NewUUID(), "live", 2) // same name, other UID
	orphanOldGen := mk("orphan-old-generation", live.UID, "live", 1)
	current := mk("current", live.UID, "live", 2)
	inFlight := mk("in-flight", live.UID, "live", 3) // created, status write not landed
	untagged := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "untagged", Namespace: ns, Labels: map[string]string{
			providers.TagManagedBy: providers.ManagedByValue, providers.TagProvider: "kubernetes"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	require.NoError(t, env.Client.Create(ctx, untagged))

	clock := clocktesting.NewFakePassiveClock(time.Now())
	gc := garbagecollection.New(reg, env.Client, slog.Default(), garbagecollection.Options{Interval: time.Hour, Grace: 10 * time.Minute, Clock: clock})

	assert.Zero(t, gc.Sweep(ctx), "everything is younger than the grace period")
	assert.Len(t, pods(t, ns), 6)

	clock.SetTime(time.Now().Add(11 * time.Minute))
	assert.Equal(t, 3, gc.Sweep(ctx))
	left := pods(t, ns)
	for _, id := range []string{orphanDeleted, orphanRenamed, orphanOldGen} {
		assert.NotContains(t, left, name(id), "orphan %s collected", id)
	}
	for _, id := range []string{current, inFlight} {
		assert.Contains(t, left, name(id), "%s belongs to the reconciler", id)
	}
	assert.Contains(t, left, "untagged", "an instance without an owner UID is never touched")
	assert.Zero(t, gc.Sweep(ctx), "a second sweep finds nothing")
}

func name(id string) string {
	var ns, n string
	_, _ = fmt.Sscanf(id, "kubernetes://%s", &ns)
	for i := range ns {
		if ns[i] == '/' {
			n = ns[i+1:]
		}
	}
	return n
}

func pods(t *testing.T, ns string) []string {
	list := &corev1.PodList{}
	require.NoError(t, env.Client.List(context.Background(), list, client.InNamespace(ns)))
	var out []string
	for _, p := range list.Items {
		out = append(out, p.Name)
	}
	return out
}
