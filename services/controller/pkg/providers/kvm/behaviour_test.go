package kvm_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"libvirt.org/go/libvirtxml"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
)

func owner(name string) providers.Owner {
	return providers.Owner{UID: types.UID(uuid.NewUUID()), Namespace: "crawl", Name: name, Generation: 1}
}

func create(t *testing.T, p providers.Provider, o providers.Owner, zone, image string) *providers.Instance {
	t.Helper()
	inst, err := p.Create(context.Background(), request(providers.InstanceName(o.Name, o.UID, o.Generation), o, zone, image))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Delete(context.Background(), inst.ProviderID) })
	return inst
}

// waitState polls Get as the reconciler does.
func waitState(t *testing.T, p providers.Provider, id string, want providers.InstanceState) *providers.Instance {
	t.Helper()
	var got *providers.Instance
	require.Eventually(t, func() bool {
		var err error
		got, err = p.Get(context.Background(), id)
		return err == nil && got.State == want
	}, time.Minute, 50*time.Millisecond, "%s never reached %s", id, want)
	return got
}

// One image download per host, verified; each VM an overlay on it plus a
// NoCloud seed the kernel's iso9660 driver reads back; a running domain;
// Delete removes the domain and every volume it owned, and only those.
func TestImageOverlaySeedAndDelete(t *testing.T) {
	f := kvmtest.NewFixture(t)
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		t.Run(typ, func(t *testing.T) {
			// A host per type: the image cache is the pool's, shared by
			// every entry on the host.
			h := f.Host(t, "hv-"+typ, kvmtest.Options{})
			before := f.Images.Downloads.Load()
			p := newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{h}, func(c map[string]any) {
				c["vendorData"] = "#cloud-config\nntp: {enabled: true}\n"
				c["installGuestAgent"] = true
			}))
			one := create(t, p, owner("one"), "", "tiny") // the only host: zone may be omitted
			two := create(t, p, owner("two"), h.Name, "tiny")
			for _, inst := range []*providers.Instance{one, two} {
				got := waitState(t, p, inst.ProviderID, providers.StateRunning)
				assert.Empty(t, got.IP, "no address before the guest has spoken")
			}
			assert.Equal(t, int32(1), f.Images.Downloads.Load()-before, "the image is downloaded once per host and shared")

			_, name := domainOf(one.ProviderID)
			vols := volumes(t, h)
			base := ""
			for _, v := range vols {
				if strings.HasPrefix(v, "egress-proxies-image-tiny-") && !strings.HasSuffix(v, ".verified") {
					base = v
				}
			}
			require.NotEmpty(t, base, "base volume in %v", vols)
			assert.Contains(t, vols, base+".verified")
			assert.Contains(t, vols, name+"-disk.qcow2")
			assert.Contains(t, vols, name+"-seed.iso")

			// The disk is a copy-on-write overlay of the base, sized diskSizeGb.
			info, err := exec.Command("qemu-img", "info", "-U", "--output=human", filepath.Join(h.PoolDir(), name+"-disk.qcow2")).CombinedOutput()
			require.NoError(t, err, "%s", info)
			assert.Contains(t, string(info), "backing file: "+filepath.Join(h.PoolDir(), base))
			assert.Contains(t, string(info), "virtual size: 1 GiB")

			seed := readSeed(t, filepath.Join(h.PoolDir(), name+"-seed.iso"))
			assert.Equal(t, "#cloud-config\npackages: [squid]\n", seed["user-data"])
			assert.Equal(t, "instance-id: "+name+"\nlocal-hostname: "+name+"\n", seed["meta-data"])
			assert.Contains(t, seed["vendor-data"], "ntp: {enabled: true}", "vendor-data from the config")
			assert.Contains(t, seed["vendor-data"], "qemu-guest-agent", "and the guest agent, merged as multipart")

			l := h.Libvirt(t)
			d, err := l.DomainLookupByName(name)
			require.NoError(t, err)
			domXML, err := l.DomainGetXMLDesc(d, 0)
			require.NoError(t, err)
			dom := &libvirtxml.Domain{}
			require.NoError(t, dom.Unmarshal(domXML))
			assert.Equal(t, uint(64), dom.Memory.Value/1024, "64 MiB from machineType small")
			assert.Equal(t, kvmtest.Bridge, dom.Devices.Interfaces[0].Source.Bridge.Bridge)
			assert.Equal(t, "org.qemu.guest_agent.0", dom.Devices.Channels[0].Target.VirtIO.Name)

			require.NoError(t, p.Delete(context.Background(), one.ProviderID))
			_, err = p.Get(context.Background(), one.ProviderID)
			assert.True(t, providers.IsNotFound(err), "%v", err)
			vols = volumes(t, h)
			assert.NotContains(t, vols, name+"-disk.qcow2")
			assert.NotContains(t, vols, name+"-seed.iso")
			assert.Contains(t, vols, base, "the base image stays for the next VM")
			_, twoName := domainOf(two.ProviderID)
			assert.Contains(t, vols, twoName+"-disk.qcow2", "another VM's volumes are untouched")

			// A domain gone by hand still has its volumes removed.
			require.NoError(t, l.DomainDestroy(mustLookup(t, h, twoName)))
			require.NoError(t, l.DomainUndefine(mustLookup(t, h, twoName)))
			require.NoError(t, p.Delete(context.Background(), two.ProviderID))
			assert.NotContains(t, volumes(t, h), twoName+"-disk.qcow2")
		})
	}
}

func mustLookup(t *testing.T, h *kvmtest.Host, name string) libvirt.Domain {
	t.Helper()
	d, err := h.Libvirt(t).DomainLookupByName(name)
	require.NoError(t, err)
	return d
}

// readSeed extracts the seed ISO with libarchive's bsdtar, an independent
// ISO 9660 reader (this kernel has no iso9660 driver to mount it with):
// Rock Ridge names and the cidata label are what a guest's cloud-init
// needs.
func readSeed(t *testing.T, path string) map[string]string {
	t.Helper()
	label, err := exec.Command("blkid", "-o", "value", "-s", "LABEL", path).CombinedOutput()
	require.NoError(t, err, "%s", label)
	assert.Equal(t, "cidata", strings.TrimSpace(string(label)), "NoCloud looks for the volume label cidata")
	dir := t.TempDir()
	out, err := exec.Command("bsdtar", "-xf", path, "-C", dir).CombinedOutput()
	require.NoError(t, err, "extracting the seed: %s", out)
	files := map[string]string{}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		require.NoError(t, err)
		files[e.Name()] = string(b)
	}
	return files
}

// A checksum that does not match fails clearly, as a config error, and
// leaves no base volume behind to be trusted later.
func TestBadChecksumFailsClearly(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		t.Run(typ, func(t *testing.T) {
			p := newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{h}, nil))
			o := owner("bad")
			inst, err := p.Create(context.Background(), request(providers.InstanceName(o.Name, o.UID, 1), o, "", "corrupted"))
			if err == nil {
				// kvm2 provisions in the background: the error comes from Get.
				t.Cleanup(func() { _ = p.Delete(context.Background(), inst.ProviderID) })
				require.Eventually(t, func() bool {
					_, err = p.Get(context.Background(), inst.ProviderID)
					return err != nil
				}, time.Minute, 50*time.Millisecond)
			}
			require.Error(t, err)
			assert.True(t, providers.IsInvalidConfig(err), "no retry can fix a checksum: %v", err)
			assert.Contains(t, err.Error(), "images.corrupted.checksum")
			assert.Contains(t, err.Error(), "has sha256:"+strings.TrimPrefix(f.Img.Checksum, "sha256:"))
			for _, v := range volumes(t, h) {
				assert.False(t, strings.HasPrefix(v, "egress-proxies-image-corrupted-"), "unverified image %s left in the pool", v)
			}
		})
	}
}

// An image larger than diskSizeGb is refused before anything is defined:
// an overlay smaller than its image would cut the guest's disk short.
func TestImageLargerThanTheDiskIsRefused(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	l := h.Libvirt(t)
	pool, err := l.StoragePoolLookupByName(kvmtest.Pool)
	require.NoError(t, err)
	big := &libvirtxml.StorageVolume{Name: "big.qcow2", Capacity: &libvirtxml.StorageVolumeSize{Unit: "GiB", Value: 2},
		Target: &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}}}
	bigXML, err := big.Marshal()
	require.NoError(t, err)
	_, err = l.StorageVolCreateXML(pool, bigXML, 0) // sparse: 2 GiB virtual, a few KiB on disk
	require.NoError(t, err)

	for _, typ := range []string{kvm.Type, kvm.Type2} {
		t.Run(typ, func(t *testing.T) {
			p := newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{h}, nil)) // diskSizeGb: 1
			o := owner("big")
			_, err := p.Create(context.Background(), request(providers.InstanceName(o.Name, o.UID, 1), o, "", "big.qcow2"))
			require.Error(t, err)
			assert.True(t, providers.IsInvalidConfig(err), "no retry can fix it: %v", err)
			assert.Contains(t, err.Error(), `spec.placement.image "big.qcow2" (volume big.qcow2 on host hv-a) is 2.00 GiB, more than diskSizeGb 1`)
			doms, _, err := l.ConnectListAllDomains(1, 0)
			require.NoError(t, err)
			assert.Empty(t, doms, "nothing was defined")
		})
	}
}

// A host whose key is not the one known_hosts holds is refused before
// anything is sent, with a message naming the host.
func TestHostKeyMismatchRefusesToConnect(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := kvmtest.Start(t, "hv-a", kvmtest.Options{}, f.Key.Signer.PublicKey())
	impostor := kvmtest.NewKey(t).Signer.PublicKey()
	require.NoError(t, os.WriteFile(f.KnownHosts, []byte(h.KnownHostsWithKey(impostor)), 0o600))
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		p := newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{h}, nil))
		_, err := p.Create(context.Background(), request("px-a-00000000-1", owner("a"), "", "tiny"))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "kvm host hv-a ("+h.Addr+")")
		assert.Contains(t, err.Error(), "host key mismatch")
		_, err = p.List(context.Background())
		assert.ErrorContains(t, err, "host key mismatch")
	}
	assert.Empty(t, volumes(t, h), "nothing reached the host")
}

// A host that goes silent sends no RST, and go-libvirt's calls take no
// context: SSH keepalives fail the waiting call within the interval
// (instead of the 2-minute call bound), saying why; once the host answers
// again the next call redials.
func TestSilentHostFailsWithinTheKeepalive(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		t.Run(typ, func(t *testing.T) {
			p := newProvider(t, typ, typ+"-home", f.Config([]*kvmtest.Host{h}, func(c map[string]any) { c["keepaliveSeconds"] = 2 }))
			inst := create(t, p, owner("silent-"+typ), "", "tiny")
			waitState(t, p, inst.ProviderID, providers.StateRunning)

			h.Freeze()
			_, err := p.Get(context.Background(), inst.ProviderID)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "kvm host hv-a ("+h.Addr+"): stopped answering: no SSH keepalive reply within 2s")

			h.Thaw()
			require.Eventually(t, func() bool {
				_, err = p.Get(context.Background(), inst.ProviderID)
				return err == nil
			}, 30*time.Second, 100*time.Millisecond, "never redialled: %v", err)
		})
	}
}

// kvm2 checks the pool before creating anything: a pool without room for
// the VM's disk is the contract's quota kind, so the reconciler waits.
func TestKVM2FullPoolIsQuota(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-small", kvmtest.Options{PoolMiB: 64})
	p := newProvider(t, kvm.Type2, "kvm2-home", f.Config([]*kvmtest.Host{h}, nil))
	o := owner("big")
	_, err := p.Create(context.Background(), request(providers.InstanceName(o.Name, o.UID, 1), o, "", "tiny"))
	require.Error(t, err)
	assert.True(t, providers.IsQuota(err), "%v", err)
	assert.Contains(t, err.Error(), "storage pool egress has")
	assert.Contains(t, err.Error(), "a VM needs 1.00 GiB")
	assert.Contains(t, err.Error(), "hv-small")
	doms, _, err := h.Libvirt(t).ConnectListAllDomains(1, 0)
	require.NoError(t, err)
	assert.Empty(t, doms, "nothing was defined")
}

// kvm2 reads the key on every dial: a rotated Secret is used by the next
// connection with no restart. kvm read it at start and keeps using it, so
// once the host revokes the old key its error says so.
func TestRotatedKeyIsUsedOnTheNextDial(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	p2 := newProvider(t, kvm.Type2, "kvm2-home", f.Config([]*kvmtest.Host{h}, nil))
	p1 := newProvider(t, kvm.Type, "kvm-home", f.Config([]*kvmtest.Host{h}, nil))
	inst := create(t, p2, owner("rot"), "", "tiny")
	_, err := p1.List(context.Background())
	require.NoError(t, err)

	rotated := kvmtest.NewKey(t)
	require.NoError(t, os.WriteFile(f.KeyFile, rotated.PEM, 0o600)) // the kubelet updates the mounted Secret
	h.Authorize(t, rotated.Signer.PublicKey())                      // and the host revokes the old key
	h.Cut()                                                         // every open connection ends
	h.Restore()

	// The first call may still meet the connection the cut ended; the
	// reconciler's next poll dials again.
	require.Eventually(t, func() bool {
		_, err = p2.Get(context.Background(), inst.ProviderID)
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "kvm2 never dialled again with the rotated key: %v", err)

	require.Eventually(t, func() bool {
		_, err = p1.List(context.Background())
		return err != nil && strings.Contains(err.Error(), `SSH login as "root" refused`)
	}, 30*time.Second, 100*time.Millisecond, "kvm still holds the revoked key: %v", err)
	assert.Contains(t, err.Error(), "kvm host hv-a")
}

// kvm2: while one Proxy's image download stalls, another Proxy on the same
// host is created and runs; then the stalled one finishes.
func TestKVM2SlowDownloadDoesNotDelayOthers(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	p := newProvider(t, kvm.Type2, "kvm2-home", f.Config([]*kvmtest.Host{h}, nil))
	slow := create(t, p, owner("slow"), "", "slow")
	<-f.Images.Started // the slow download is under way, and stays so until released

	fast := create(t, p, owner("fast"), "", "tiny")
	waitState(t, p, fast.ProviderID, providers.StateRunning)

	got, err := p.Get(context.Background(), slow.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, providers.StatePending, got.State, "still downloading")
	close(f.Images.Release)
	waitState(t, p, slow.ProviderID, providers.StateRunning)
}

// The two types never touch each other's VMs: different ownership tags.
func TestTypesIgnoreEachOthersVMs(t *testing.T) {
	f := kvmtest.NewFixture(t)
	h := f.Host(t, "hv-a", kvmtest.Options{})
	p1 := newProvider(t, kvm.Type, "home", f.Config([]*kvmtest.Host{h}, nil))
	p2 := newProvider(t, kvm.Type2, "home", f.Config([]*kvmtest.Host{h}, nil)) // even under one entry name
	o := owner("mine")
	inst := create(t, p1, o, "", "tiny")
	_, name := domainOf(inst.ProviderID)

	list, err := p2.List(context.Background())
	require.NoError(t, err)
	assert.Empty(t, list, "kvm2 lists no kvm VM")
	_, err = p2.Create(context.Background(), request(name, o, "", "tiny"))
	assert.ErrorContains(t, err, "carries no kvm2 tags", "kvm2 does not adopt a kvm VM of the same name")
	err = p2.Delete(context.Background(), "kvm2://"+h.Name+"/"+name)
	assert.ErrorContains(t, err, "refusing to touch it")
	_, err = p2.Get(context.Background(), inst.ProviderID)
	assert.ErrorContains(t, err, "is not kvm2://")
	waitState(t, p1, inst.ProviderID, providers.StateRunning)
	assert.Contains(t, volumes(t, h), name+"-disk.qcow2", "its volumes are untouched")
}

// Placement is resolved against the config before any host is contacted
// (this config's only host is unreachable), and each error names the
// field and what would be valid.
func TestPlacementErrorsNameTheField(t *testing.T) {
	f := kvmtest.NewFixture(t)
	cfg := f.Config(nil, func(c map[string]any) {
		c["hosts"] = map[string]any{
			"hv-a": map[string]any{"address": "127.0.0.1:1", "user": "root", "pool": "p", "bridge": "br0"},
			"hv-b": map[string]any{"address": "127.0.0.1:1", "user": "root", "pool": "p", "network": "default"},
		}
	})
	for _, typ := range []string{kvm.Type, kvm.Type2} {
		p := newProvider(t, typ, "home", cfg)
		for _, c := range []struct{ zone, machineType, image, want string }{
			{"", "small", "tiny", "spec.placement.zone is required by provider \"home\", which has several hosts: hv-a, hv-b"},
			{"hv-z", "small", "tiny", "spec.placement.zone \"hv-z\" names no host of provider \"home\" (hosts: hv-a, hv-b)"},
			{"hv-a", "", "tiny", "spec.placement.machineType is required"},
			{"hv-a", "huge", "tiny", "spec.placement.machineType \"huge\" names no machine type of provider \"home\" (machineTypes: small)"},
			{"hv-a", "small", "", "spec.placement.image is required by provider \"home\" (images: corrupted, slow, tiny"},
		} {
			req := request("px-x-00000000-1", owner("x"), c.zone, c.image)
			req.Placement.MachineType = c.machineType
			_, err := p.Create(context.Background(), req)
			require.Error(t, err)
			assert.True(t, providers.IsInvalidConfig(err), "%v", err)
			assert.Contains(t, err.Error(), c.want)
		}
		_, err := p.Get(context.Background(), typ+"://hv-gone/px-x-00000000-1")
		assert.True(t, providers.IsInvalidConfig(err))
		assert.False(t, providers.IsNotFound(err), "a host dropped from the config is never read as a gone VM")
		assert.ErrorContains(t, err, `host "hv-gone" of instance px-x-00000000-1 is no longer in the hosts of provider "home"`)
		assert.ErrorContains(t, p.Delete(context.Background(), typ+"://hv-gone/px-x-00000000-1"), "skip-cleanup")
	}
}
