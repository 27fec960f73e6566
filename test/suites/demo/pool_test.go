package demo

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// A leased pool member is drained, not cut: scaled away, it takes no new
// lease, its lease renews up to the drain deadline, and the member goes
// only once the lease has ended (here at the TTL of its last renewal).
// The unleased member goes at once. Real controller, broker, Redis,
// prober and Squids.
func TestALeasedPoolMemberIsDrainedNotCut(t *testing.T) {
	s, ns := up(t, system.Options{Probers: 1, Brokers: 1})
	ctx := context.Background()
	b := s.Brokers[0].REST
	pool := &v1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: "drain", Namespace: ns},
		Spec: v1.ProxyPoolSpec{Replicas: ptr.To[int32](2), Template: v1.ProxyTemplate{Spec: v1.ProxyTemplateSpec{
			Provider: "kubernetes", Attributes: map[string]string{"pool": "drain"},
		}}},
	}
	require.NoError(t, env.Client.Create(ctx, pool))
	require.Eventually(t, func() bool { return listedIn(t, b, ns) == 2 }, 90*time.Second, 100*time.Millisecond, "both members leasable")

	lease := rest.Do(t, "POST", b+"/v1/leases", `{"selector":{"pool":"drain"},"ttlSeconds":120,"namespace":"`+ns+`"}`)
	require.Equal(t, 200, lease.Status, "%s", lease.Body)
	leaseID := lease.JSON["leaseID"].(string)
	leased := lease.JSON["proxy"].(map[string]any)["id"].(string)
	// The controller reads leases every 500 ms: wait until it has.
	require.Eventually(t, func() bool {
		var p v1.ProxyPool
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &p))
		return p.Status.LeasedReplicas == 1
	}, 30*time.Second, 100*time.Millisecond, "the pool sees the lease")

	require.NoError(t, env.Client.Patch(ctx, pool, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"replicas":0}}`))))
	name := leased[len(ns)+1:]
	var px v1.Proxy
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &px))
		_, ok := px.Annotations[v1.AnnotationDrainDeadline]
		return ok
	}, 30*time.Second, 100*time.Millisecond, "the leased member drains")
	require.Eventually(t, func() bool { return listedIn(t, b, ns) == 1 }, 30*time.Second, 100*time.Millisecond, "the unleased member is gone")

	refused := rest.Do(t, "POST", b+"/v1/leases", `{"selector":{"pool":"drain"},"namespace":"`+ns+`"}`)
	assert.Equal(t, 429, refused.Status, "no new lease on a draining member: %s", refused.Body)
	renewed := rest.Do(t, "POST", b+"/v1/leases/"+leaseID+"/renew", `{"ttlSeconds":10}`)
	require.Equal(t, 200, renewed.Status, "the live lease still renews: %s", renewed.Body)
	expires, err := time.Parse(time.RFC3339Nano, renewed.JSON["expiresAt"].(string))
	require.NoError(t, err)

	// It stays while the lease lives, and goes once it has expired.
	for time.Now().Before(expires.Add(-time.Second)) {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &px)
		require.NoError(t, err, "the member was deleted while its lease lived (expires %s)", expires)
		require.True(t, px.DeletionTimestamp.IsZero(), "the member was deleted while its lease lived (expires %s)", expires)
		time.Sleep(200 * time.Millisecond)
	}
	require.Eventually(t, func() bool {
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &px)
		return apierrors.IsNotFound(err) || !px.DeletionTimestamp.IsZero()
	}, 30*time.Second, 100*time.Millisecond, "the member goes once its lease has expired")
	gone := rest.Do(t, "POST", b+"/v1/leases/"+leaseID+"/renew", `{}`)
	assert.Equal(t, 404, gone.Status, "the lease ended at its TTL, it was not cut: %s", gone.Body)
}
