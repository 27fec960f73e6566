package lifecycle_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
)

// The reconciler drives kvm2 on two real hosts: a Proxy becomes Ready at
// the VM's address. A host that becomes unreachable holds its Proxy's
// deletion with a condition naming it, until the host is back. A host
// dropped from the config holds deletion too, naming the host, until
// skip-cleanup abandons the VM.
func TestKVMProxyThroughTheReconciler(t *testing.T) {
	h := newHarness(t)
	f := kvmtest.NewFixture(t)
	a, b := f.Host(t, "hv-a", kvmtest.Options{}), f.Host(t, "hv-b", kvmtest.Options{})
	config := func(hosts ...*kvmtest.Host) []byte {
		block, err := json.Marshal(f.Config(hosts, nil))
		require.NoError(t, err)
		return block
	}
	h.kvm2 = config(a, b)
	h.start()

	up := func(name string, host *kvmtest.Host) *v1.Proxy {
		px := h.managed(name, "kvm-home")
		px.Spec.Placement = &v1.Placement{Zone: host.Name, MachineType: "small", Image: "tiny"}
		px.Spec.CloudInit = &v1.CloudInit{Inline: "#cloud-config\npackages: [squid]\n"}
		h.create(px)
		prov := h.waitFor(name, "a providerID", func(p *v1.Proxy) bool { return p.Status.ProviderID != "" })
		ip := host.Boot(t, domain(prov))
		ready := h.waitFor(name, "Ready", func(p *v1.Proxy) bool { return p.Status.Phase == v1.PhaseReady })
		assert.Equal(t, ip, ready.Status.IP, "status.ip is the address the host's neighbour table holds")
		assert.True(t, strings.HasPrefix(ready.Status.ProviderID, "kvm2://"+host.Name+"/px-"+name+"-"), ready.Status.ProviderID)
		return ready
	}
	cleanupFailed := func(name string) *v1.Proxy {
		return h.waitFor(name, "CleanupFailed", func(p *v1.Proxy) bool {
			c := ready(p)
			return c != nil && c.Reason == v1.ReasonCleanupFailed
		})
	}

	// Unreachable: deletion waits and says which host; then completes.
	onB := up("on-b", b)
	b.Cut()
	require.NoError(t, env.Client.Delete(context.Background(), onB))
	stuck := cleanupFailed("on-b")
	assert.Contains(t, ready(stuck).Message, "kvm host hv-b ("+b.Addr+")")
	assert.Contains(t, ready(stuck).Message, v1.AnnotationSkipCleanup)
	assert.True(t, b.HasDomain(t, domain(onB)))
	b.Restore()
	h.waitGone("on-b")
	assert.False(t, b.HasDomain(t, domain(onB)), "the finalizer deleted the VM once the host answered")

	// Removed from the config: deletion waits and names the host, until
	// skip-cleanup abandons the VM.
	onA := up("on-a", a)
	h.stop()
	h.kvm2 = config(b)
	h.start()
	require.NoError(t, env.Client.Delete(context.Background(), onA))
	stuck = cleanupFailed("on-a")
	assert.Contains(t, ready(stuck).Message, `host "hv-a" of instance `+domain(onA)+` is no longer in the hosts of provider "kvm-home"`)
	h.update("on-a", func(px *v1.Proxy) {
		if px.Annotations == nil {
			px.Annotations = map[string]string{}
		}
		px.Annotations[v1.AnnotationSkipCleanup] = "true"
	})
	h.waitGone("on-a")
	assert.True(t, a.HasDomain(t, domain(onA)), "abandoned, not deleted: it is the user's to remove by hand")
}

func domain(px *v1.Proxy) string {
	return px.Status.ProviderID[strings.LastIndex(px.Status.ProviderID, "/")+1:]
}
