package kvmtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// Image is a small qcow2 made by qemu-img: no guest boots from it (this
// machine cannot download a cloud image), but qemu starts a VM on it and
// the volume chain is the real one. AddNeighbour then plays the guest's
// first packet, which is what a booted guest would do.
type Image struct {
	Data     []byte
	Checksum string
}

func NewImage(t testing.TB) Image {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tiny.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-f", "qcow2", path, "16M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	data, err := os.ReadFile(path)
	must(t, err)
	sum := sha256.Sum256(data)
	return Image{Data: data, Checksum: "sha256:" + hex.EncodeToString(sum[:])}
}

// ImageServer serves images on loopback and counts downloads. A path
// under /slow/ waits for release before sending its body.
type ImageServer struct {
	*httptest.Server
	Downloads atomic.Int32
	Started   chan struct{}
	Release   chan struct{}
}

func ServeImage(t testing.TB, img Image) *ImageServer {
	s := &ImageServer{Started: make(chan struct{}, 16), Release: make(chan struct{})}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Downloads.Add(1)
		w.Header().Set("Content-Length", fmt.Sprint(len(img.Data)))
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			s.Started <- struct{}{}
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-s.Release:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write(img.Data)
	}))
	t.Cleanup(s.Close)
	return s
}

// Fixture is a controller's view of some hosts: key files and an image.
type Fixture struct {
	Key        *Key
	Dir        string
	KeyFile    string
	KnownHosts string
	Img        Image
	Images     *ImageServer
}

func NewFixture(t testing.TB) *Fixture {
	Skip(t)
	f := &Fixture{Key: NewKey(t), Dir: t.TempDir(), Img: NewImage(t)}
	f.KeyFile = filepath.Join(f.Dir, "id_ed25519")
	f.KnownHosts = filepath.Join(f.Dir, "known_hosts")
	must(t, os.WriteFile(f.KeyFile, f.Key.PEM, 0o600))
	must(t, os.WriteFile(f.KnownHosts, nil, 0o600))
	f.Images = ServeImage(t, f.Img)
	return f
}

// Host starts a host that trusts the fixture's key and adds it to
// known_hosts.
func (f *Fixture) Host(t testing.TB, name string, opts Options) *Host {
	h := Start(t, name, opts, f.Key.Signer.PublicKey())
	kh, err := os.ReadFile(f.KnownHosts)
	must(t, err)
	must(t, os.WriteFile(f.KnownHosts, append(kh, h.KnownHosts()...), 0o600))
	return h
}

// Config is a providers-config block for hosts; edit tweaks it.
func (f *Fixture) Config(hosts []*Host, edit func(map[string]any)) map[string]any {
	hs := map[string]any{}
	for _, h := range hosts {
		hs[h.Name] = map[string]any{"address": h.Addr, "user": "root", "pool": Pool, "bridge": Bridge}
	}
	cfg := map[string]any{
		"sshKeyFile": f.KeyFile, "knownHostsFile": f.KnownHosts,
		"machineTypes": map[string]any{"small": map[string]any{"vcpus": 1, "memoryMiB": 64}},
		"hosts":        hs,
		"images": map[string]any{
			"tiny":      map[string]any{"url": f.Images.URL + "/tiny.qcow2", "checksum": f.Img.Checksum},
			"slow":      map[string]any{"url": f.Images.URL + "/slow/tiny.qcow2", "checksum": f.Img.Checksum},
			"corrupted": map[string]any{"url": f.Images.URL + "/tiny.qcow2", "checksum": "sha256:" + strings.Repeat("0", 64)},
		},
		"diskSizeGb": 1,
	}
	if edit != nil {
		edit(cfg)
	}
	return cfg
}
