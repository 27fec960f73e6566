package kvm_test

import (
	"testing"
	"time"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/providertest"
)

// TestContract runs the provider contract suite for both types, each on
// two real hosts (libvirtd and sshd in namespaces of their own), VMs
// placed on the second so zone selection is exercised.
func TestContract(t *testing.T) {
	f := kvmtest.NewFixture(t)
	a, b := f.Host(t, "hv-a", kvmtest.Options{}), f.Host(t, "hv-b", kvmtest.Options{})
	hosts := map[string]*kvmtest.Host{a.Name: a, b.Name: b}
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		t.Run(typ, func(t *testing.T) {
			p := newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{a, b}, nil))
			providertest.Run(t, &providertest.Harness{
				Provider: p,
				Request: func(name string, o providers.Owner) *providers.CreateRequest {
					return request(name, o, b.Name, "tiny")
				},
				MakeReady:      func(t *testing.T, inst *providers.Instance) { makeReady(t, hosts, inst.ProviderID) },
				CreateUntagged: func(t *testing.T) { defineUntagged(t, b, "someone-elses-vm-"+typ) },
				Timeout:        time.Minute,
			})
		})
	}
}
