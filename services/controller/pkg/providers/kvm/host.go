package kvm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket/dialers"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// lane names what a libvirt connection is used for. kvm sends every lane
// over one connection per host. kvm2 keeps one connection each for
// reconcile RPCs and health checks, and dials a connection of its own for
// every bulk operation (an image download, a VM's provisioning), closed
// after it: a long upload never queues a reconcile's RPC behind its 4 MiB
// packets, and cancelling one job closes nobody else's connection.
type lane int

const (
	// laneRPC carries reconcile calls: define, lookup, state, delete.
	laneRPC lane = iota
	// laneBulk carries image downloads and background provisioning.
	laneBulk
	// laneCheck carries host health checks (reachability before a List).
	laneCheck
)

func (l lane) String() string { return [...]string{"rpc", "bulk", "check"}[l] }

// credentials returns what an SSH dial needs. kvm reads the files once at
// start; kvm2 on every dial, so a rotated Secret is used without a restart.
type credentials func() (ssh.Signer, ssh.HostKeyCallback, error)

func readCredentials(c *Config) credentials {
	return func() (ssh.Signer, ssh.HostKeyCallback, error) {
		key, err := os.ReadFile(c.SSHKeyFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading SSH key (is the kvm-ssh Secret created?): %w", err)
		}
		signer, err := ssh.ParsePrivateKey(key)
		if err != nil {
			return nil, nil, fmt.Errorf("parsing SSH key %s: %w", c.SSHKeyFile, err)
		}
		if c.InsecureIgnoreHostKey {
			return signer, ssh.InsecureIgnoreHostKey(), nil //nolint:gosec // asked for in config, warned at start
		}
		cb, err := knownhosts.New(c.KnownHostsFile)
		if err != nil {
			return nil, nil, fmt.Errorf("reading known_hosts (is the kvm-ssh Secret created?): %w", err)
		}
		return signer, cb, nil
	}
}

// onceCredentials reads the files once and keeps the result, error included.
func onceCredentials(read credentials) credentials {
	s, cb, err := read()
	return func() (ssh.Signer, ssh.HostKeyCallback, error) { return s, cb, err }
}

// HostError says which host an operation failed on and why; every error
// the provider returns about a host is one, so a Proxy's condition names
// the host.
type HostError struct {
	Host, Address string
	Err           error
}

func (e *HostError) Error() string {
	return fmt.Sprintf("kvm host %s (%s): %v", e.Host, e.Address, e.Err)
}
func (e *HostError) Unwrap() error { return e.Err }

// conn is one SSH connection carrying one libvirt connection.
type conn struct {
	ssh *ssh.Client
	lv  *libvirt.Libvirt
	// silent is set when keepalive gave the connection up, so the calls
	// it fails say why.
	silent atomic.Bool
}

func (c *conn) close() {
	// Closing SSH ends the channel under libvirt, which fails every call
	// in flight: this is how a cancelled context stops a hung RPC, since
	// go-libvirt's calls take none.
	_ = c.ssh.Close()
}

func (c *conn) alive() bool {
	select {
	case <-c.lv.Disconnected():
		return false
	default:
		return true
	}
}

// keepalive closes the connection once the host misses a reply. A host
// that went silent (powered off, a firewall dropping packets) sends no
// RST, and go-libvirt's calls take no context: without it a call would
// hang until callTimeout. OpenSSH answers any global request, refusing an
// unknown one, so the reply itself is the sign of life.
func (c *conn) keepalive(every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-c.lv.Disconnected():
			return
		case <-tick.C:
		}
		replied := make(chan struct{})
		go func() {
			_, _, _ = c.ssh.SendRequest("keepalive@openssh.com", true, nil)
			close(replied)
		}()
		select {
		case <-replied:
		case <-time.After(every):
			c.silent.Store(true)
			c.close()
			return
		}
	}
}

// host is one configured hypervisor and its open connections.
type host struct {
	name  string
	cfg   Host
	creds credentials
	gen   *generation
	// keepalive is the interval of every connection's keepalive.
	keepalive time.Duration

	mu    sync.Mutex
	conns map[lane]*conn
	// domType is the domain type the host offers (kvm, else qemu), asked
	// once.
	domType string
	// dialing serialises dials per lane, so concurrent reconciles share
	// one new connection instead of each opening their own.
	dialing map[lane]*sync.Mutex
}

func newHost(name string, cfg Host, creds credentials, gen *generation, keepalive time.Duration) *host {
	h := &host{name: name, cfg: cfg, creds: creds, gen: gen, keepalive: keepalive, conns: map[lane]*conn{}, dialing: map[lane]*sync.Mutex{}}
	for _, l := range []lane{laneRPC, laneCheck} {
		h.dialing[gen.lane(l)] = &sync.Mutex{}
	}
	return h
}

func (h *host) errorf(format string, args ...any) error {
	return &HostError{Host: h.name, Address: h.cfg.sshAddress(), Err: fmt.Errorf(format, args...)}
}

const (
	dialTimeout = 15 * time.Second
	// callTimeout bounds a call on a shared connection whose caller set
	// no deadline (reconciles have none): a host that stopped answering
	// must not hold a worker forever. The connection is then closed, as
	// a stuck call cannot be told from a dead host.
	callTimeout = 2 * time.Minute
)

// conn returns the open connection of lane, dialing one if there is none
// or the last one died.
func (h *host) conn(ctx context.Context, l lane) (*conn, error) {
	l = h.gen.lane(l)
	d := h.dialing[l]
	d.Lock()
	defer d.Unlock()
	h.mu.Lock()
	c := h.conns[l]
	h.mu.Unlock()
	if c != nil && c.alive() {
		return c, nil
	}
	c, err := h.dial(ctx)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.conns[l] = c
	h.mu.Unlock()
	return c, nil
}

func (h *host) dial(ctx context.Context) (*conn, error) {
	signer, hostKeys, err := h.creds()
	if err != nil {
		return nil, h.errorf("%w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	addr := h.cfg.sshAddress()
	tcp, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, h.errorf("unreachable: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = tcp.Close() })
	sc, chans, reqs, err := ssh.NewClientConn(tcp, addr, &ssh.ClientConfig{
		User: h.cfg.User, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)}, HostKeyCallback: hostKeys,
	})
	stop()
	if err != nil {
		_ = tcp.Close()
		return nil, h.errorf("%s", sshFailure(err, h.cfg.User))
	}
	client := ssh.NewClient(sc, chans, reqs)
	unix, err := client.Dial("unix", h.cfg.socket())
	if err != nil {
		_ = client.Close()
		return nil, h.errorf("reaching libvirt's socket %s over SSH: %w", h.cfg.socket(), err)
	}
	lv := libvirt.NewWithDialer(dialers.NewAlreadyConnected(unix))
	if err := lv.ConnectToURI(libvirt.ConnectURI(h.cfg.uri())); err != nil {
		_ = client.Close()
		return nil, h.errorf("connecting to %s: %w", h.cfg.uri(), err)
	}
	c := &conn{ssh: client, lv: lv}
	go c.keepalive(h.keepalive)
	return c, nil
}

// sshFailure turns an SSH handshake error into what a human must fix.
func sshFailure(err error, user string) string {
	var ke *knownhosts.KeyError
	switch {
	case errors.As(err, &ke) && len(ke.Want) > 0:
		return fmt.Sprintf("host key mismatch: the host's key is not the one known_hosts holds for it; refusing to connect (%v)", err)
	case errors.As(err, &ke):
		return fmt.Sprintf("host key unknown: the host is not in known_hosts; refusing to connect (%v)", err)
	case strings.Contains(err.Error(), "unable to authenticate"):
		return fmt.Sprintf("SSH login as %q refused: the key is not (or no longer) authorized on the host (%v)", user, err)
	default:
		return fmt.Sprintf("SSH handshake failed: %v", err)
	}
}

// do runs one libvirt call on lane. kvm2 records it as a child span. A
// context that ends first closes the connection, failing the call; a dead
// connection is redialled by the next call.
func (h *host) do(ctx context.Context, l lane, name string, call func(*libvirt.Libvirt) error) error {
	ctx, span := h.gen.startSpan(ctx, "libvirt."+name,
		attribute.String("kvm.host", h.name), attribute.String("kvm.lane", h.gen.lane(l).String()))
	err := h.doUntraced(ctx, l, call)
	if span != nil {
		if err != nil && !isLibvirt(err, libvirt.ErrNoDomain, libvirt.ErrNoStorageVol, libvirt.ErrNoDomainMetadata) {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}
	return err
}

func (h *host) doUntraced(ctx context.Context, l lane, call func(*libvirt.Libvirt) error) error {
	var c *conn
	var err error
	if h.gen.lane(l) == laneBulk {
		if c, err = h.dial(ctx); err != nil {
			return err
		}
		defer c.close()
	} else {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, callTimeout)
			defer cancel()
		}
		if c, err = h.conn(ctx, l); err != nil {
			return err
		}
	}
	stop := context.AfterFunc(ctx, c.close)
	err = call(c.lv)
	stop()
	if err == nil {
		return nil
	}
	return h.failure(ctx, c, err)
}

// failure says why a call on c failed: cut short by its context, the
// host gone silent, the connection lost, or the host's own answer.
func (h *host) failure(ctx context.Context, c *conn, err error) error {
	switch {
	case ctx.Err() != nil:
		return h.errorf("%w (the call was cut short: %v)", ctx.Err(), err)
	case c.silent.Load():
		return h.errorf("stopped answering: no SSH keepalive reply within %s; the connection was closed: %w", h.keepalive, err)
	case !c.alive():
		return h.errorf("connection lost: %w", err)
	}
	return h.errorf("%w", err)
}

// inDomain runs call with the named domain; a missing one fails with
// libvirt's ErrNoDomain, which callers read as they need.
func (h *host) inDomain(ctx context.Context, l lane, rpc, name string, call func(*libvirt.Libvirt, libvirt.Domain) error) error {
	return h.do(ctx, l, rpc, func(lv *libvirt.Libvirt) error {
		d, err := lv.DomainLookupByName(name)
		if err != nil {
			return err
		}
		return call(lv, d)
	})
}

// exec runs a command on the host over the RPC lane's SSH connection.
func (h *host) exec(ctx context.Context, cmd string) ([]byte, error) {
	_, span := h.gen.startSpan(ctx, "ssh.exec", attribute.String("kvm.host", h.name), attribute.String("ssh.command", cmd))
	if span != nil {
		defer span.End()
	}
	c, err := h.conn(ctx, laneRPC)
	if err != nil {
		return nil, err
	}
	s, err := c.ssh.NewSession()
	if err != nil {
		return nil, h.failure(ctx, c, fmt.Errorf("opening an SSH session: %w", err))
	}
	defer s.Close()
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	out, err := s.Output(cmd)
	if err != nil {
		return nil, h.failure(ctx, c, fmt.Errorf("running %q: %w", cmd, err))
	}
	return out, nil
}

// isLibvirt reports whether err carries one of libvirt's error numbers.
func isLibvirt(err error, codes ...libvirt.ErrorNumber) bool {
	var le libvirt.Error
	if !errors.As(err, &le) {
		return false
	}
	for _, c := range codes {
		if le.Code == uint32(c) {
			return true
		}
	}
	return false
}
