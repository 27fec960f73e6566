package kvm_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/stretchr/testify/require"
	"libvirt.org/go/libvirtxml"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm/kvmtest"
)

// image is a small qcow2 made by qemu-img: no guest boots from it (this
// machine cannot download a cloud image), but qemu starts a VM on it and
// the volume chain is the real one. AddNeighbour then plays the guest's
// first packet, which is what a booted guest would do.
type image struct {
	data     []byte
	checksum string
}

func newImage(t *testing.T) image {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.qcow2")
	out, err := exec.Command("qemu-img", "create", "-f", "qcow2", path, "16M").CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	sum := sha256.Sum256(data)
	return image{data: data, checksum: "sha256:" + hex.EncodeToString(sum[:])}
}

// imageServer serves images on loopback and counts downloads. A path
// under /slow/ waits for release before sending its body.
type imageServer struct {
	*httptest.Server
	downloads atomic.Int32
	started   chan struct{}
	release   chan struct{}
}

func serveImage(t *testing.T, img image) *imageServer {
	s := &imageServer{started: make(chan struct{}, 16), release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.downloads.Add(1)
		w.Header().Set("Content-Length", fmt.Sprint(len(img.data)))
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			s.started <- struct{}{}
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-s.release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write(img.data)
	}))
	t.Cleanup(s.Close)
	return s
}

// fixture is a controller's view of some hosts: key files and an image.
type fixture struct {
	key        *kvmtest.Key
	dir        string
	keyFile    string
	knownHosts string
	img        image
	images     *imageServer
}

func newFixture(t *testing.T) *fixture {
	kvmtest.Skip(t)
	f := &fixture{key: kvmtest.NewKey(t), dir: t.TempDir(), img: newImage(t)}
	f.keyFile = filepath.Join(f.dir, "id_ed25519")
	f.knownHosts = filepath.Join(f.dir, "known_hosts")
	require.NoError(t, os.WriteFile(f.keyFile, f.key.PEM, 0o600))
	require.NoError(t, os.WriteFile(f.knownHosts, nil, 0o600))
	f.images = serveImage(t, f.img)
	return f
}

// host starts a host that trusts the fixture's key and adds it to
// known_hosts.
func (f *fixture) host(t *testing.T, name string, opts kvmtest.Options) *kvmtest.Host {
	h := kvmtest.Start(t, name, opts, f.key.Signer.PublicKey())
	kh, err := os.ReadFile(f.knownHosts)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.knownHosts, append(kh, h.KnownHosts()...), 0o600))
	return h
}

// config is a providers-config block for hosts; edit tweaks it.
func (f *fixture) config(hosts []*kvmtest.Host, edit func(map[string]any)) map[string]any {
	hs := map[string]any{}
	for _, h := range hosts {
		hs[h.Name] = map[string]any{"address": h.Addr, "user": "root", "pool": kvmtest.Pool, "bridge": kvmtest.Bridge}
	}
	cfg := map[string]any{
		"sshKeyFile": f.keyFile, "knownHostsFile": f.knownHosts,
		"machineTypes": map[string]any{"small": map[string]any{"vcpus": 1, "memoryMiB": 64}},
		"hosts":        hs,
		"images": map[string]any{
			"tiny":      map[string]any{"url": f.images.URL + "/tiny.qcow2", "checksum": f.img.checksum},
			"slow":      map[string]any{"url": f.images.URL + "/slow/tiny.qcow2", "checksum": f.img.checksum},
			"corrupted": map[string]any{"url": f.images.URL + "/tiny.qcow2", "checksum": "sha256:" + strings.Repeat("0", 64)},
		},
		"diskSizeGb": 1,
	}
	if edit != nil {
		edit(cfg)
	}
	return cfg
}

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

var nextIP atomic.Int32

// makeReady waits for the VM to run, then plays its first packet.
func makeReady(t *testing.T, hosts map[string]*kvmtest.Host, id string) {
	t.Helper()
	hostName, name := domainOf(id)
	h := hosts[hostName]
	l := h.Libvirt(t)
	var domXML string
	require.Eventually(t, func() bool {
		d, err := l.DomainLookupByName(name)
		if err != nil {
			return false
		}
		state, _, err := l.DomainGetState(d, 0)
		if err != nil || libvirt.DomainState(state) != libvirt.DomainRunning {
			return false
		}
		domXML, err = l.DomainGetXMLDesc(d, 0)
		return err == nil
	}, time.Minute, 100*time.Millisecond, "domain %s never ran", id)
	dom := &libvirtxml.Domain{}
	require.NoError(t, dom.Unmarshal(domXML))
	h.AddNeighbour(t, fmt.Sprintf("192.0.2.%d", 10+nextIP.Add(1)), dom.Devices.Interfaces[0].MAC.Address)
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
	require.NoError(t, l.StoragePoolRefresh(pool, 0))
	vols, _, err := l.StoragePoolListAllVolumes(pool, 1, 0)
	require.NoError(t, err)
	var names []string
	for _, v := range vols {
		names = append(names, v.Name)
	}
	return names
}
