// Package providertest is the contract suite every provider must pass. The
// rules it checks are the ones the reconciler and orphan GC depend on but
// the Provider interface cannot express: idempotent Create on a
// deterministic name, a self-contained providerID, NotFound only when the
// instance is really gone, owner and CreatedAt read back for GC, and List
// returning only tagged instances.
package providertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Harness adapts one provider to the suite.
type Harness struct {
	// Provider under test, freshly built for this run.
	Provider providers.Provider
	// Request returns a valid CreateRequest for name and owner.
	Request func(name string, owner providers.Owner) *providers.CreateRequest
	// MakeReady plays the part of whatever makes an instance run and get
	// an address where nothing does here (a kubelet, a booting guest); nil
	// when the backend gets there by itself.
	MakeReady func(t *testing.T, inst *providers.Instance)
	// CreateUntagged puts an instance without our tags into the backend;
	// nil when the backend cannot hold one.
	CreateUntagged func(t *testing.T)
	// Timeout bounds each wait; 30s when zero.
	Timeout time.Duration
}

func (h *Harness) timeout() time.Duration {
	if h.Timeout == 0 {
		return 30 * time.Second
	}
	return h.Timeout
}

func owner() providers.Owner {
	return providers.Owner{UID: types.UID(uuid.NewUUID()), Namespace: "contract", Name: "proxy", Generation: 1}
}

// Run runs the whole suite.
func Run(t *testing.T, h *Harness) {
	t.Run("create is idempotent and the instance reads back", func(t *testing.T) { createIdempotent(t, h) })
	t.Run("same name with another owner is refused", func(t *testing.T) { foreignOwner(t, h) })
	t.Run("instance becomes ready with an address", func(t *testing.T) { becomesReady(t, h) })
	t.Run("list returns only tagged instances with owner and createdAt", func(t *testing.T) { listTagged(t, h) })
	t.Run("delete is idempotent and get then reports not found", func(t *testing.T) { deleteIdempotent(t, h) })
	t.Run("malformed providerID is not a not-found", func(t *testing.T) { malformedID(t, h) })
}

func create(t *testing.T, h *Harness, o providers.Owner) (*providers.CreateRequest, *providers.Instance) {
	t.Helper()
	req := h.Request(providers.InstanceName(o.Name, o.UID, o.Generation), o)
	inst, err := h.Provider.Create(context.Background(), req)
	require.NoError(t, err)
	require.NotNil(t, inst)
	t.Cleanup(func() { _ = h.Provider.Delete(context.Background(), inst.ProviderID) })
	return req, inst
}

func createIdempotent(t *testing.T, h *Harness) {
	o := owner()
	before := time.Now().Add(-time.Minute)
	req, first := create(t, h, o)
	require.NotEmpty(t, first.ProviderID, "providerID")

	again, err := h.Provider.Create(context.Background(), req)
	require.NoError(t, err, "a retried Create of the same name and owner is success")
	assert.Equal(t, first.ProviderID, again.ProviderID)

	got, err := h.Provider.Get(context.Background(), first.ProviderID)
	require.NoError(t, err, "Get needs nothing but the providerID")
	assert.Equal(t, req.Name, got.Name)
	assert.Equal(t, o.UID, got.Owner.UID)
	assert.Equal(t, o.Generation, got.Owner.Generation)
	assert.False(t, got.CreatedAt.IsZero(), "CreatedAt is read back from the backend")
	assert.True(t, got.CreatedAt.After(before), "CreatedAt %v is the backend's creation time", got.CreatedAt)

	n := 0
	all, err := h.Provider.List(context.Background())
	require.NoError(t, err)
	for _, i := range all {
		if i.Owner.UID == o.UID {
			n++
		}
	}
	assert.Equal(t, 1, n, "two Creates made exactly one instance")
}

func foreignOwner(t *testing.T, h *Harness) {
	o := owner()
	req, _ := create(t, h, o)
	other := *req
	other.Owner.UID = types.UID(uuid.NewUUID())
	_, err := h.Provider.Create(context.Background(), &other)
	require.Error(t, err, "an instance of that name owned by someone else is never adopted")
}

func becomesReady(t *testing.T, h *Harness) {
	_, inst := create(t, h, owner())
	if h.MakeReady != nil {
		h.MakeReady(t, inst)
	}
	require.Eventually(t, func() bool {
		got, err := h.Provider.Get(context.Background(), inst.ProviderID)
		return err == nil && got.Ready()
	}, h.timeout(), 100*time.Millisecond, "instance never became Running with an IP")
}

func listTagged(t *testing.T, h *Harness) {
	if h.CreateUntagged != nil {
		h.CreateUntagged(t)
	}
	o := owner()
	_, inst := create(t, h, o)
	all, err := h.Provider.List(context.Background())
	require.NoError(t, err)
	var found *providers.Instance
	for _, i := range all {
		require.NotEmpty(t, i.Owner.UID, "List returned an instance without an owner: %+v", i)
		if i.ProviderID == inst.ProviderID {
			found = i
		}
	}
	require.NotNil(t, found, "List misses %s", inst.ProviderID)
	assert.Equal(t, o.UID, found.Owner.UID)
	assert.Equal(t, o.Generation, found.Owner.Generation)
	assert.False(t, found.CreatedAt.IsZero())
}

func deleteIdempotent(t *testing.T, h *Harness) {
	_, inst := create(t, h, owner())
	require.NoError(t, h.Provider.Delete(context.Background(), inst.ProviderID))
	require.Eventually(t, func() bool {
		_, err := h.Provider.Get(context.Background(), inst.ProviderID)
		return providers.IsNotFound(err)
	}, h.timeout(), 100*time.Millisecond, "Get never reported NotFound after Delete")
	require.NoError(t, h.Provider.Delete(context.Background(), inst.ProviderID), "deleting a gone instance is nil")
}

func malformedID(t *testing.T, h *Harness) {
	_, err := h.Provider.Get(context.Background(), "nonsense")
	require.Error(t, err)
	assert.False(t, providers.IsNotFound(err), "a malformed providerID must not read as a gone instance")
}
