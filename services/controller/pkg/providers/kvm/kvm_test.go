package kvm_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
)

func newProvider(t *testing.T, typ, entry string, cfg map[string]any) providers.Provider {
	t.Helper()
	p, err := build(typ, entry, cfg)
	require.NoError(t, err)
	return p
}

func build(typ, entry string, cfg map[string]any) (providers.Provider, error) {
	block, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	factory := map[string]providers.Factory{kvm.Type: kvm.New, kvm.Type2: kvm.New2}[typ]
	return factory(context.Background(), providers.Entry{Name: entry, Type: typ, Block: block}, providers.Deps{})
}

func request(name string, o providers.Owner, zone, image string) *providers.CreateRequest {
	return &providers.CreateRequest{Name: name, Owner: o, Port: 3128, CloudInit: []byte("#cloud-config\npackages: [squid]\n"),
		Placement: v1.Placement{Zone: zone, MachineType: "small", Image: image}}
}

// domainOf splits a providerID into host and domain.
func domainOf(id string) (string, string) {
	_, rest, _ := strings.Cut(id, "://")
	h, d, _ := strings.Cut(rest, "/")
	return h, d
}

// makeReady plays the booted guest of the instance.
func makeReady(t *testing.T, hosts map[string]*kvmtest.Host, id string) {
	t.Helper()
	hostName, name := domainOf(id)
	hosts[hostName].Boot(t, name)
}

// defineUntagged puts a domain without our tags on h.
func defineUntagged(t *testing.T, h *kvmtest.Host, name string) {
	t.Helper()
	l := h.Libvirt(t)
	d, err := l.DomainDefineXMLFlags(fmt.Sprintf(`<domain type="qemu"><name>%s</name><memory unit="MiB">64</memory><os><type arch="x86_64">hvm</type></os></domain>`, name), 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.DomainUndefine(d) })
}

// volumes lists the names in h's pool.
func volumes(t *testing.T, h *kvmtest.Host) []string {
	t.Helper()
	l := h.Libvirt(t)
	pool, err := l.StoragePoolLookupByName(kvmtest.Pool)
	require.NoError(t, err)
	// No refresh: libvirt tracks the volumes made through it, and refuses
	// a refresh while any is being built.
	vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
	require.NoError(t, err)
	var names []string
	for _, v := range vols {
		names = append(names, v.Name)
	}
	return names
}
