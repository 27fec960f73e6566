package lifecycle_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/gcp/fakecompute"
)

// The reconciler drives the real Compute client against the local Compute
// API: a quota answer waits (not Failed), then the VM is inserted, polled
// to RUNNING, and the Proxy is Ready at the NAT IP; deletion deletes it.
func TestGCPProxyThroughTheReconciler(t *testing.T) {
	h := newHarness(t)
	h.compute = fakecompute.New()
	defer h.compute.Close()
	h.compute.FailNextInsert(403, "quotaExceeded", "Quota 'IN_USE_ADDRESSES' exceeded. Limit: 8.0 in region europe-west1.")
	h.start()
	px := h.managed("vm", "gcp-eu")
	px.Spec.Placement = &v1.Placement{Zone: "europe-west1-b", MachineType: "e2-micro", Image: "projects/debian-cloud/global/images/family/debian-12"}
	px.Spec.CloudInit = &v1.CloudInit{Inline: "#cloud-config\npackages: [squid]\n"}
	h.create(px)

	// The wait lasts one backoff step; its Event outlives it.
	ev := h.waitEvent("vm", v1.ReasonQuotaExceeded)
	assert.Equal(t, string(v1.PhaseProvisioning), ev.Action, "quota waits, it does not fail")
	assert.Contains(t, ev.Note, "IN_USE_ADDRESSES")

	ready := h.waitFor("vm", "Ready", func(p *v1.Proxy) bool { return p.Status.Phase == v1.PhaseReady })
	assert.True(t, strings.HasPrefix(ready.Status.IP, "203.0.113."), "status.ip is the NAT IP: %s", ready.Status.IP)
	assert.True(t, strings.HasPrefix(ready.Status.ProviderID, "gcp://p/europe-west1-b/px-vm-"), ready.Status.ProviderID)
	assert.Equal(t, 1, h.compute.Len())

	require.NoError(t, envClientDelete(ready))
	h.waitGone("vm")
	assert.Zero(t, h.compute.Len(), "the finalizer deleted the VM")
}

func envClientDelete(px *v1.Proxy) error { return env.Client.Delete(context.Background(), px) }
