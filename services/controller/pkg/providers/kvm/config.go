package kvm

import (
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Config is the `kvm:` (or `kvm2:`) block of a providers-config entry.
type Config struct {
	// SSHKeyFile is the controller's private key (the kvm-ssh Secret's
	// id_ed25519). Required.
	SSHKeyFile string `json:"sshKeyFile"`
	// KnownHostsFile holds every host's key. Required unless
	// InsecureIgnoreHostKey.
	KnownHostsFile string `json:"knownHostsFile,omitempty"`
	// InsecureIgnoreHostKey accepts any host key (logged as a warning).
	InsecureIgnoreHostKey bool `json:"insecureIgnoreHostKey,omitempty"`
	// MachineTypes are the sizes placement.machineType names. Required.
	MachineTypes map[string]MachineType `json:"machineTypes"`
	// Hosts are the hypervisors placement.zone names. Required.
	Hosts map[string]Host `json:"hosts"`
	// Images are the base images placement.image names, downloaded into a
	// host's pool on first use. A name not listed here must be a volume
	// that already exists in the host's pool.
	Images map[string]Image `json:"images,omitempty"`
	// DiskSizeGb is the size of each VM's disk; default 10.
	DiskSizeGb int64 `json:"diskSizeGb,omitempty"`
	// VendorData is cloud-init vendor-data given to every VM.
	VendorData string `json:"vendorData,omitempty"`
	// InstallGuestAgent adds qemu-guest-agent to every VM (through
	// vendor-data) and its channel to the domain, so the VM's address can
	// be asked of the guest itself.
	InstallGuestAgent bool `json:"installGuestAgent,omitempty"`
	// KeepaliveSeconds is how often each SSH connection asks its host for
	// a reply; a host that gives none within as long is taken as gone, and
	// the calls waiting on it fail. Default 15.
	KeepaliveSeconds int `json:"keepaliveSeconds,omitempty"`
}

// MachineType is one VM size.
type MachineType struct {
	VCPUs     int `json:"vcpus"`
	MemoryMiB int `json:"memoryMiB"`
}

// Host is one hypervisor.
type Host struct {
	// Address is host or host:port of its sshd (port 22 by default).
	Address string `json:"address"`
	// User logs in over SSH; it needs access to libvirt's socket.
	User string `json:"user"`
	// Pool is the libvirt storage pool for images and VM volumes.
	Pool string `json:"pool"`
	// Bridge or Network (exactly one) is where each VM's NIC is plugged:
	// a host bridge to the uplink, or a libvirt network.
	Bridge  string `json:"bridge,omitempty"`
	Network string `json:"network,omitempty"`
	// Socket is libvirt's socket on the host; default
	// /var/run/libvirt/libvirt-sock.
	Socket string `json:"socket,omitempty"`
	// URI is the libvirt connection URI on the host; default qemu:///system.
	URI string `json:"uri,omitempty"`
}

// Image is a base image: a URL and the SHA-256 of what it serves.
type Image struct {
	URL string `json:"url"`
	// Checksum is "sha256:<64 hex digits>".
	Checksum string `json:"checksum"`
}

const (
	defaultSocket     = "/var/run/libvirt/libvirt-sock"
	defaultURI        = "qemu:///system"
	defaultDiskSizeGb = 10
	defaultKeepalive  = 15
)

// sha256Hex returns the hex digest of a checked "sha256:<hex>" checksum.
func (i Image) sha256Hex() string { return strings.TrimPrefix(i.Checksum, "sha256:") }

// decodeConfig decodes and checks an entry's block; every error names the
// entry and the field.
func decodeConfig(e providers.Entry) (*Config, error) {
	var c Config
	if err := e.DecodeBlock(&c); err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("provider %s: %s.%s", e.Name, e.Type, fmt.Sprintf(format, args...))
	}
	if c.SSHKeyFile == "" {
		return nil, bad("sshKeyFile is required (the kvm-ssh Secret's id_ed25519, e.g. /etc/proxy-operator/kvm/id_ed25519)")
	}
	if c.KnownHostsFile == "" && !c.InsecureIgnoreHostKey {
		return nil, bad("knownHostsFile is required unless insecureIgnoreHostKey is true")
	}
	if len(c.MachineTypes) == 0 {
		return nil, bad("machineTypes is required (name -> {vcpus, memoryMiB})")
	}
	for _, n := range sortedKeys(c.MachineTypes) {
		m := c.MachineTypes[n]
		if m.VCPUs < 1 {
			return nil, bad("machineTypes.%s.vcpus must be at least 1", n)
		}
		if m.MemoryMiB < 64 {
			return nil, bad("machineTypes.%s.memoryMiB must be at least 64", n)
		}
	}
	if len(c.Hosts) == 0 {
		return nil, bad("hosts is required (name -> {address, user, pool, bridge or network})")
	}
	for _, n := range sortedKeys(c.Hosts) {
		h := c.Hosts[n]
		// A host's name is part of every providerID of its VMs.
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return nil, bad("hosts.%s: a host name must be a DNS label (it is part of every providerID): %s", n, strings.Join(errs, "; "))
		}
		for _, f := range []struct{ name, v string }{{"address", h.Address}, {"user", h.User}, {"pool", h.Pool}} {
			if f.v == "" {
				return nil, bad("hosts.%s.%s is required", n, f.name)
			}
		}
		if (h.Bridge == "") == (h.Network == "") {
			return nil, bad("hosts.%s needs exactly one of bridge or network", n)
		}
		if _, _, err := net.SplitHostPort(h.sshAddress()); err != nil {
			return nil, bad("hosts.%s.address %q: %v", n, h.Address, err)
		}
	}
	for _, n := range sortedKeys(c.Images) {
		img := c.Images[n]
		if img.URL == "" {
			return nil, bad("images.%s.url is required", n)
		}
		sum, ok := strings.CutPrefix(img.Checksum, "sha256:")
		if _, err := hex.DecodeString(sum); !ok || err != nil || len(sum) != 64 {
			return nil, bad("images.%s.checksum %q must be sha256:<64 hex digits>", n, img.Checksum)
		}
	}
	if c.DiskSizeGb < 0 {
		return nil, bad("diskSizeGb must not be negative")
	}
	if c.DiskSizeGb == 0 {
		c.DiskSizeGb = defaultDiskSizeGb
	}
	if c.KeepaliveSeconds < 0 || c.KeepaliveSeconds > 300 {
		return nil, bad("keepaliveSeconds %d must be between 1 and 300 (0 for the default, %d)", c.KeepaliveSeconds, defaultKeepalive)
	}
	if c.KeepaliveSeconds == 0 {
		c.KeepaliveSeconds = defaultKeepalive
	}
	return &c, nil
}

// sshAddress is Address with the default port.
func (h Host) sshAddress() string {
	if _, _, err := net.SplitHostPort(h.Address); err == nil {
		return h.Address
	}
	return net.JoinHostPort(h.Address, "22")
}

func (h Host) socket() string {
	if h.Socket == "" {
		return defaultSocket
	}
	return h.Socket
}

func (h Host) uri() string {
	if h.URI == "" {
		return defaultURI
	}
	return h.URI
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
