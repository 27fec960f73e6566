package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/vendors"
	"k8s.io/utils/clock"
)

// Options configure a Gateway.
type Options struct {
	// Addr is the plaintext listener's address.
	Addr string
	// TLSAddr, when set, is a second listener's address, serving the
	// gateway over TLS (an HTTPS proxy: the proxy password and every
	// request head encrypted on the way in) with TLS's certificate.
	TLSAddr string
	TLS     *tls.Config
	// CapacityWait is how long a request waits for a lease slot when
	// every one it could take is held (0: refused at once).
	CapacityWait time.Duration
	// MaxConns bounds the client connections open at once, and
	// MaxConnsPerSource those from one address (0: no bound): past
	// either a new connection is refused at once, before anything of it
	// is read, so no client without a token can hold the broker's memory.
	MaxConns, MaxConnsPerSource int
	// Egress is where a client may be taken: checked on the addresses a
	// destination resolves to, here, before any lease is taken.
	Egress netpolicy.Egress
	// HeaderTimeout bounds how long a client may take to send a request's
	// head (a slow client holds nothing longer).
	HeaderTimeout time.Duration
	// IdleTimeout closes a tunnel, or a keep-alive connection between
	// requests, after this long with no byte either way (a tunnel within
	// twice that).
	IdleTimeout time.Duration
	// TunnelTimeout is the longest a tunnel or a plain request lives.
	TunnelTimeout time.Duration
	// LeaseTTL is the TTL of each tunnel's lease, renewed while the tunnel
	// lives: a gateway that dies leaves leases that end within it, and a
	// tunnel whose proxy stops being leasable (deleted, unhealthy, past
	// its drain deadline) is closed at the next renewal.
	LeaseTTL time.Duration
	// DialTimeout bounds resolving the destination, dialling the leased
	// proxy and its answer to CONNECT.
	DialTimeout time.Duration
	// MaxHeaderBytes bounds a request's head: past it the client gets 431.
	MaxHeaderBytes int
	// Retries is how many more proxies a request tries when the leased one
	// fails on its own hop before any byte reached the client.
	Retries int
	// TokenMaxTunnels is the most tunnels and requests in flight the
	// callers of one token may hold on this gateway (0: no limit).
	TokenMaxTunnels int
	// DNS, when set, is the host:port of the DNS server destinations are
	// resolved with (over UDP, TCP for long answers) instead of the
	// system's resolver: a cluster's resolver of its own, or a test's.
	DNS string
	// Resolver resolves destinations; nil means DNS's, or the system's.
	Resolver Resolver
	// Meter counts the bytes of the tunnels of tenants with a
	// gatewayBytesPerDay quota, fleet-wide (the store); nil enforces no
	// byte quota.
	Meter Meter
	// Clock times the leases' renewals and dates the byte quota's day;
	// nil is the wall clock. Tests step a fake one. Sockets' deadlines
	// are the kernel's, on the wall clock.
	Clock clock.WithTicker
}

// Meter counts each tenant's gateway bytes by UTC day.
type Meter interface {
	// AddTenantBytes counts n bytes at now, and returns the day's total.
	AddTenantBytes(ctx context.Context, tenant string, n int64, now time.Time) (int64, error)
	// TenantBytes is now's day's total.
	TenantBytes(ctx context.Context, tenant string, now time.Time) (int64, error)
}

// Resolver resolves a host name (net.Resolver is one).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DefaultOptions are what the broker's flags default to.
var DefaultOptions = Options{HeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, TunnelTimeout: time.Hour, LeaseTTL: time.Minute,
	DialTimeout: 10 * time.Second, MaxHeaderBytes: 16 << 10, TokenMaxTunnels: 1000, Retries: 2, MaxConns: 4000, MaxConnsPerSource: 1000, CapacityWait: time.Second}

// ErrNoCertificate is the refusal to serve TLS without a certificate.
var ErrNoCertificate = errors.New("--gateway-tls-addr needs --tls-cert-file and --tls-key-file: the certificate it serves")

// Validate names the first bad option, as its flag (--gateway-*).
func (o Options) Validate() error {
	switch {
	case o.HeaderTimeout <= 0 || o.IdleTimeout <= 0 || o.DialTimeout <= 0:
		return errors.New("--gateway-header-timeout, --gateway-idle-timeout and --gateway-dial-timeout must be positive")
	case o.TunnelTimeout < time.Second:
		return fmt.Errorf("--gateway-tunnel-timeout %s must be at least 1s", o.TunnelTimeout)
	case o.LeaseTTL < 3*time.Second || o.LeaseTTL%time.Second != 0:
		return fmt.Errorf("--gateway-lease-ttl %s must be whole seconds, at least 3s", o.LeaseTTL)
	case o.MaxHeaderBytes < 1024:
		return fmt.Errorf("--gateway-max-header-bytes %d must be at least 1024", o.MaxHeaderBytes)
	case o.DNS != "" && !isHostPort(o.DNS):
		return fmt.Errorf("--gateway-dns %q must be host:port", o.DNS)
	case o.Retries < 0 || o.Retries > maxRetries:
		return fmt.Errorf("--gateway-retries %d must be between 0 and %d", o.Retries, maxRetries)
	case o.TokenMaxTunnels < 0:
		return errors.New("--gateway-token-max-tunnels must not be negative")
	case o.CapacityWait < 0 || o.CapacityWait > o.TunnelTimeout:
		return fmt.Errorf("--gateway-capacity-wait %s must be between 0 and --gateway-tunnel-timeout", o.CapacityWait)
	case o.MaxConns < 0 || o.MaxConnsPerSource < 0:
		return errors.New("--gateway-max-conns and --gateway-max-conns-per-source must not be negative")
	}
	return nil
}

// maxRetries bounds --gateway-retries: each costs a dial timeout at
// worst, and a fleet where four proxies in a row fail has a problem no
// retry hides.
const maxRetries = 4

// Options a client puts in its proxy user name.
type userOptions struct {
	namespace string
	session   string
	selector  map[string]string
}

// attrPrefix marks a selector attribute among the user name's options.
const attrPrefix = "attr."

// parseUser reads the user name's options: comma-separated name=value
// pairs, namespace=<ns>, session=<key> and attr.<attribute>=<value> (any
// number), each at most once; an empty name means none. Values are
// checked by the lease API, which names the field.
//
// A user name in one of the vendors' grammars (package vendors) is read
// as aliases, so a crawler's existing proxy URL works with only the host,
// port and password switched: its session is the session key, its
// country the country attribute; the account, zone and groups are the
// vendor's business and ignored; an option the vendor does not know is
// refused by name.
func parseUser(user string) (userOptions, error) {
	var o userOptions
	if user == "" {
		return o, nil
	}
	if preset := vendors.Detect(user); preset != "" && !strings.Contains(user, "=") {
		s, err := vendors.Parse(preset, user)
		if err != nil {
			return o, fmt.Errorf("proxy user name: %w", err)
		}
		o.session = s.ID
		if s.Country != "" {
			o.selector = map[string]string{"country": s.Country}
		}
		return o, nil
	}
	seen := map[string]bool{}
	for _, pair := range strings.Split(user, ",") {
		name, value, ok := strings.Cut(pair, "=")
		switch {
		case !ok || name == "":
			return o, fmt.Errorf("proxy user name option %q is not name=value (options: namespace=, session=, attr.<attribute>=, comma-separated)", clip(pair))
		case value == "":
			return o, fmt.Errorf("proxy user name option %q has an empty value", clip(name))
		case seen[name]:
			return o, fmt.Errorf("proxy user name option %q is given twice", clip(name))
		}
		seen[name] = true
		switch {
		case name == "namespace":
			o.namespace = value
		case name == "session":
			o.session = value
		case strings.HasPrefix(name, attrPrefix) && len(name) > len(attrPrefix):
			if o.selector == nil {
				o.selector = map[string]string{}
			}
			o.selector[name[len(attrPrefix):]] = value
		default:
			return o, fmt.Errorf("proxy user name option %q is unknown (options: namespace=, session=, attr.<attribute>=)", clip(name))
		}
	}
	return o, nil
}

// clip bounds what of a client's input an answer quotes.
func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func isHostPort(s string) bool {
	host, port, err := net.SplitHostPort(s)
	return err == nil && host != "" && port != ""
}

// resolver is the Resolver o names.
func (o Options) resolver() Resolver {
	switch {
	case o.Resolver != nil:
		return o.Resolver
	case o.DNS != "":
		return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, o.DNS)
		}}
	}
	return net.DefaultResolver
}
