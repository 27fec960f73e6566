// Package kvmtest runs hypervisor hosts for the kvm providers' tests: each
// is a real libvirtd (Debian's, with the qemu driver) and a real sshd, in
// a mount namespace of its own (private /run/libvirt, /etc/libvirt and
// /var/lib/libvirt, so hosts share nothing, not even with a libvirtd the
// machine may run) and a network namespace of its own (a bridge for the
// VMs' NICs and a neighbour table no one else touches). The test reaches
// the host's sshd through a relay on 127.0.0.1 that dials into the
// namespace, so every byte travels over loopback. Needs root.
package kvmtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirtxml"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// Bridge is the bridge every host has for its VMs; Pool its storage pool.
const (
	Bridge = "br0"
	Pool   = "egress"
)

// Skip skips t where a host cannot run: not root, or libvirtd, qemu or
// sshd missing (`make deps` installs them).
func Skip(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("kvm hosts need root (mount and network namespaces, libvirtd)")
	}
	for _, bin := range []string{"/usr/sbin/libvirtd", "/usr/sbin/sshd", "/usr/bin/qemu-img", "/usr/bin/qemu-system-x86_64", "/usr/bin/unshare"} {
		if _, err := os.Stat(bin); err != nil {
			t.Skipf("%s is missing: run `make deps`", bin)
		}
	}
}

// Key is an SSH key pair for the controller's side.
type Key struct {
	Signer ssh.Signer
	// PEM is the private key in OpenSSH format, as the kvm-ssh Secret
	// holds it.
	PEM []byte
}

// NewKey makes an ed25519 key.
func NewKey(t testing.TB) *Key {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "egress-proxies test")
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return &Key{Signer: signer, PEM: pem.EncodeToMemory(block)}
}

// Options shape a host.
type Options struct {
	// PoolMiB bounds the storage pool with a tmpfs of that size; 0 puts
	// it on the test's disk.
	PoolMiB int
}

// Host is one running hypervisor.
type Host struct {
	Name string
	// Addr is what the provider's config names: the relay on loopback.
	Addr string
	// HostKey is the sshd's key, for known_hosts.
	HostKey ssh.PublicKey
	dir     string
	pid     int
	relay   *proc.Cutter
	t       testing.TB
}

// Start runs a host that accepts authorized (root logins with these keys).
func Start(t testing.TB, name string, opts Options, authorized ...ssh.PublicKey) *Host {
	t.Helper()
	Skip(t)
	// Not t.TempDir: libvirtd and qemu may still be writing into it while
	// the test's own cleanup runs, and the directory must outlive them.
	dir, err := os.MkdirTemp("", "egress-proxies-kvm-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"run", "etc", "lib", "cache", "log", "pool"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	_, hostPriv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(hostPriv, "")
	must(t, err)
	must(t, os.WriteFile(filepath.Join(dir, "ssh_host_ed25519_key"), pem.EncodeToMemory(block), 0o600))
	hostSigner, err := ssh.NewSignerFromKey(hostPriv)
	must(t, err)
	write := func(name, content string) { must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644)) }
	write("etc/libvirtd.conf", "auth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\nunix_sock_rw_perms = \"0700\"\n")
	// No virtlogd and no security driver in a test namespace; qemu runs
	// as root there.
	write("etc/qemu.conf", "user = \"root\"\ngroup = \"root\"\ndynamic_ownership = 0\nremember_owner = 0\nsecurity_driver = \"none\"\nstdio_handler = \"file\"\n")
	write("sshd_config", strings.Join([]string{
		"ListenAddress 127.0.0.1:22",
		"HostKey " + filepath.Join(dir, "ssh_host_ed25519_key"),
		"PidFile " + filepath.Join(dir, "sshd.pid"),
		"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
		"PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
		"UsePAM no", "StrictModes no", "AllowStreamLocalForwarding yes", "",
	}, "\n"))
	pool := ""
	if opts.PoolMiB > 0 {
		pool = fmt.Sprintf("mount -t tmpfs -o size=%dm tmpfs %s/pool\n", opts.PoolMiB, dir)
	}
	script := fmt.Sprintf(`set -e
D=%[1]s
mkdir -p /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt /etc/libvirt /run/sshd
mount --bind $D/run /run/libvirt
mount --bind $D/lib /var/lib/libvirt
mount --bind $D/cache /var/cache/libvirt
mount --bind $D/log /var/log/libvirt
mount --bind $D/etc /etc/libvirt
%[2]sip link set lo up
ip link add %[3]s type bridge
ip link set %[3]s up
/usr/sbin/libvirtd --pid-file $D/libvirtd.pid &
exec /usr/sbin/sshd -D -e -f $D/sshd_config
`, dir, pool, Bridge)
	p := proc.Start(t, "host-"+name, "/usr/bin/unshare", "--mount", "--net", "--propagation", "private", "/bin/bash", "-c", script)
	h := &Host{Name: name, HostKey: hostSigner.PublicKey(), dir: dir, pid: p.Cmd.Process.Pid, t: t}
	h.Authorize(t, authorized...)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	ns := fmt.Sprintf("/proc/%d/ns/net", h.pid)
	h.relay = proc.NewCutterVia(t, "127.0.0.1:22", func(target string) (net.Conn, error) { return dialInNamespace(ns, target) })
	h.Addr = h.relay.Addr
	// Registered after proc.Start, so it runs first: stop every VM while
	// libvirtd still can, since qemu outlives a killed libvirtd.
	t.Cleanup(h.destroyAll)

	deadline := time.Now().Add(30 * time.Second)
	for {
		l, err := h.local()
		if err == nil {
			h.createPool(l)
			_ = l.Disconnect()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s: libvirtd never answered: %v\n%s", name, err, p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		c, err := net.DialTimeout("tcp", h.Addr, time.Second)
		if err == nil {
			banner := make([]byte, 4)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			_, err = io.ReadFull(c, banner)
			_ = c.Close()
			if err == nil && string(banner) == "SSH-" {
				return h
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s: sshd never answered: %v\n%s", name, err, p.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// local connects to the host's libvirtd through its socket, bypassing SSH:
// the test's own view of the host.
func (h *Host) local() (*libvirt.Libvirt, error) {
	c, err := net.DialTimeout("unix", filepath.Join(h.dir, "run", "libvirt-sock"), time.Second)
	if err != nil {
		return nil, err
	}
	l := libvirt.NewWithDialer(dialers.NewAlreadyConnected(c))
	if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
		return nil, err
	}
	return l, nil
}

// Libvirt is a connection to the host's libvirtd, closed when the test ends.
func (h *Host) Libvirt(t testing.TB) *libvirt.Libvirt {
	t.Helper()
	l, err := h.local()
	if err != nil {
		t.Fatalf("host %s: %v", h.Name, err)
	}
	t.Cleanup(func() { _ = l.Disconnect() })
	return l
}

func (h *Host) createPool(l *libvirt.Libvirt) {
	xml := fmt.Sprintf(`<pool type="dir"><name>%s</name><target><path>%s</path></target></pool>`, Pool, filepath.Join(h.dir, "pool"))
	if _, err := l.StoragePoolCreateXML(xml, 0); err != nil {
		h.t.Fatalf("host %s: creating pool: %v", h.Name, err)
	}
}

func (h *Host) destroyAll() {
	l, err := h.local()
	if err != nil {
		return
	}
	defer func() { _ = l.Disconnect() }()
	doms, _, _ := l.ConnectListAllDomains(1, 0)
	for _, d := range doms {
		_ = l.DomainDestroy(d)
	}
}

// Authorize replaces the keys the host accepts; sshd reads them at every
// login, so it takes effect on the next connection.
func (h *Host) Authorize(t testing.TB, keys ...ssh.PublicKey) {
	t.Helper()
	var auth strings.Builder
	for _, k := range keys {
		auth.Write(ssh.MarshalAuthorizedKey(k))
	}
	must(t, os.WriteFile(filepath.Join(h.dir, "authorized_keys"), []byte(auth.String()), 0o600))
}

// PoolDir is where the host's pool keeps its volumes, as seen by the test.
func (h *Host) PoolDir() string { return filepath.Join(h.dir, "pool") }

// HasDomain reports whether the host has a domain of that name.
func (h *Host) HasDomain(t testing.TB, name string) bool {
	t.Helper()
	_, err := h.Libvirt(t).DomainLookupByName(name)
	if libvirt.IsNotFound(err) {
		return false
	}
	must(t, err)
	return true
}

// KnownHosts is a known_hosts line for this host, as the provider dials it.
func (h *Host) KnownHosts() string {
	return knownHostsLine(h.Addr, h.HostKey)
}

// KnownHostsWithKey is a known_hosts line claiming key for this host.
func (h *Host) KnownHostsWithKey(key ssh.PublicKey) string { return knownHostsLine(h.Addr, key) }

func knownHostsLine(addr string, key ssh.PublicKey) string {
	host, port, _ := net.SplitHostPort(addr)
	return fmt.Sprintf("[%s]:%s %s", host, port, ssh.MarshalAuthorizedKey(key))
}

// AddNeighbour plays the booted guest's part: the host learns ip at mac,
// as it would once the guest sends its first packet over the bridge.
func (h *Host) AddNeighbour(t testing.TB, ip, mac string) {
	t.Helper()
	out, err := exec.Command("nsenter", fmt.Sprintf("--net=/proc/%d/ns/net", h.pid),
		"ip", "neigh", "replace", ip, "lladdr", mac, "dev", Bridge, "nud", "permanent").CombinedOutput()
	if err != nil {
		t.Fatalf("host %s: adding neighbour: %v: %s", h.Name, err, out)
	}
}

var nextIP atomic.Int32

// Boot plays a guest booting on the domain: it waits until the domain
// runs, then adds the neighbour entry the guest's first packet would leave
// on the host, at a fresh TEST-NET-1 address (never sent to), and returns
// that address.
func (h *Host) Boot(t testing.TB, domain string) string {
	t.Helper()
	l := h.Libvirt(t)
	deadline := time.Now().Add(time.Minute)
	for {
		d, err := l.DomainLookupByName(domain)
		if err == nil {
			state, _, err := l.DomainGetState(d, 0)
			if err == nil && libvirt.DomainState(state) == libvirt.DomainRunning {
				domXML, err := l.DomainGetXMLDesc(d, 0)
				must(t, err)
				dom := &libvirtxml.Domain{}
				must(t, dom.Unmarshal(domXML))
				ip := fmt.Sprintf("192.0.2.%d", 10+nextIP.Add(1))
				h.AddNeighbour(t, ip, dom.Devices.Interfaces[0].MAC.Address)
				return ip
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s: domain %s never ran", h.Name, domain)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Cut makes the host unreachable: its relay refuses new connections and
// drops the open ones, as a host gone from the network would.
func (h *Host) Cut() { h.relay.Cut() }

// Freeze makes the host silent: connections stay open and nothing moves
// either way, as when a host loses power or a firewall drops its packets.
func (h *Host) Freeze() { h.relay.Freeze() }

// Thaw ends a Freeze.
func (h *Host) Thaw() { h.relay.Thaw() }

// Restore makes a cut host reachable again at the same address.
func (h *Host) Restore() { h.relay.Restore(h.t) }

// dialInNamespace opens a TCP connection from inside the network namespace
// at nsPath: a socket belongs to the namespace its thread was in when it
// was created, so the dial runs on a thread switched there and back.
func dialInNamespace(nsPath, addr string) (net.Conn, error) {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer orig.Close()
	target, err := os.Open(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	c, dialErr := net.DialTimeout("tcp", addr, 5*time.Second)
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// Leave the thread locked: it dies with this goroutine rather
		// than run other goroutines in the wrong namespace.
		return nil, err
	}
	runtime.UnlockOSThread()
	return c, dialErr
}
