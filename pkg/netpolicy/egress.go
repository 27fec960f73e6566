package netpolicy

import (
	"flag"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// DefaultEgressDenyCIDRs are where no proxy takes a client and no probe
// goes: this host and network (0/8, loopback), private and shared address
// space (where the cluster, its nodes and its Services live), link-local
// (every cloud's metadata service), multicast and reserved, and their IPv6
// counterparts. A client that can name one of these through a proxy
// reaches inside the network the proxy runs in.
const DefaultEgressDenyCIDRs = "0.0.0.0/8,10.0.0.0/8,100.64.0.0/10,127.0.0.0/8,169.254.0.0/16,172.16.0.0/12,192.0.0.0/24,192.168.0.0/16,198.18.0.0/15,224.0.0.0/4,240.0.0.0/4," +
	"::/128,::1/128,64:ff9b:1::/48,fc00::/7,fe80::/10,ff00::/8"

// DefaultClusterCIDRs are the pod and Service CIDRs Kubernetes installers
// use by default; the chart adds its own values to the deny list, so a
// cluster on public address space is covered too.
const DefaultClusterCIDRs = "10.244.0.0/16,10.96.0.0/12"

// DefaultEgressPorts are the ports a client may reach through a proxy, and
// DefaultEgressTLSPorts those it may CONNECT to: the web's.
const (
	DefaultEgressPorts    = "80,443"
	DefaultEgressTLSPorts = "443"
)

// Egress is where a proxy may take a client, and a probe may send a
// proxy: one policy, rendered into the Squid config of the kubernetes
// provider's pods and checked by the prober (and the lease API's gateway)
// on resolved addresses.
type Egress struct {
	// Deny: destinations no client reaches.
	Deny DenyList
	// Allowance: destinations let through whatever Deny and the ports
	// say. It exists for test targets (loopback in the suites and the
	// demo, an in-cluster Service in the real-cluster test), never for
	// production, and is named so in every flag and value.
	Allowance DenyList
	// Ports a client may reach; TLSPorts those it may CONNECT to. Empty
	// means any (the zero Egress lets everything through).
	Ports, TLSPorts Ports
}

// DefaultEgress is the policy with every default.
func DefaultEgress() Egress {
	e, err := ParseEgress(DefaultEgressDenyCIDRs+","+DefaultClusterCIDRs, "", DefaultEgressPorts, DefaultEgressTLSPorts)
	if err != nil {
		panic(err)
	}
	return e
}

// ParseEgress reads the four flag values; the error names the bad one.
func ParseEgress(deny, allowance, ports, tlsPorts string) (Egress, error) {
	var e Egress
	var err error
	if e.Deny, err = Parse(deny); err != nil {
		return e, fmt.Errorf("egress-deny-cidrs: %w", err)
	}
	if e.Allowance, err = Parse(allowance); err != nil {
		return e, fmt.Errorf("egress-allowance-cidrs: %w", err)
	}
	if e.Ports, err = ParsePorts(ports); err != nil {
		return e, fmt.Errorf("egress-ports: %w", err)
	}
	if e.TLSPorts, err = ParsePorts(tlsPorts); err != nil {
		return e, fmt.Errorf("egress-tls-ports: %w", err)
	}
	if len(e.Ports) == 0 {
		return e, fmt.Errorf("egress-ports: at least one port is needed, such as %s", DefaultEgressPorts)
	}
	return e, nil
}

// Check says why a client must not reach ip:port through a proxy
// (connect: with CONNECT), or nil.
//
// An IPv6 address that carries an IPv4 one a gateway or relay turns it
// into (NAT64's 64:ff9b::/96, 6to4's 2002::/16) is judged as that IPv4
// address too: 64:ff9b::a9fe:a9fe is the metadata service behind a NAT64.
func (e Egress) Check(ip netip.Addr, port uint16, connect bool) error {
	ip = ip.Unmap().WithZone("")
	if _, ok := e.Allowance.Denies(ip); ok {
		return nil
	}
	if p, ok := e.Deny.Denies(ip); ok {
		return &DeniedError{Addr: ip, Prefix: p}
	}
	if v4, ok := embeddedIPv4(ip); ok {
		if _, allowed := e.Allowance.Denies(v4); !allowed {
			if p, denied := e.Deny.Denies(v4); denied {
				return &DeniedError{Addr: ip, Why: fmt.Sprintf("it carries %s, in the deny list (%s)", v4, p)}
			}
		}
	}
	if len(e.Ports) > 0 && !e.Ports.Has(port) {
		return &DeniedError{Addr: ip, Why: "port " + strconv.Itoa(int(port)) + " is not an egress port (" + e.Ports.String() + ")"}
	}
	if connect && len(e.TLSPorts) > 0 && !e.TLSPorts.Has(port) {
		return &DeniedError{Addr: ip, Why: "CONNECT to port " + strconv.Itoa(int(port)) + " is not allowed (egress TLS ports: " + e.TLSPorts.String() + ")"}
	}
	return nil
}

var (
	nat64     = netip.MustParsePrefix("64:ff9b::/96")
	sixToFour = netip.MustParsePrefix("2002::/16")
)

// embeddedIPv4 is the IPv4 address ip carries, if it is a NAT64 or 6to4
// one.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	b := ip.As16()
	switch {
	case !ip.Is6():
	case nat64.Contains(ip):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// CheckHost is Check for a host that may be a name: a name passes here
// (whoever dials it checks the addresses it resolves to).
func (e Egress) CheckHost(host string, port uint16, connect bool) error {
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		return nil
	}
	return e.Check(ip, port, connect)
}

// SquidRules are the squid.conf access rules enforcing e, ahead of every
// allow: the cache manager, then (past the allowance) denied
// destinations and ports, then clients matching the ACL named admit
// (proxy_auth: who has the credentials; "all" for an open proxy). Squid
// checks dst on the addresses it resolves and then connects to, so a name
// that resolves inside cannot get round it.
//
// A CONNECT may go to any egress port, not only TLSPorts: the gateway and
// the prober carry plain HTTP in a tunnel to the address they checked
// (Squid would otherwise resolve the name again, and it rewrites Host
// from an absolute URI's address). TLSPorts is held where clients'
// CONNECTs are judged: the gateway and the prober.
func (e Egress) SquidRules(admit string) string {
	var b strings.Builder
	acl := func(name, typ string, vals []string) {
		for _, chunk := range chunks(vals, 16) {
			fmt.Fprintf(&b, "acl %s %s %s\n", name, typ, strings.Join(chunk, " "))
		}
	}
	if len(e.Allowance) > 0 {
		acl("egress_allowance", "dst", e.Allowance.strings())
	}
	if len(e.Deny) > 0 {
		acl("egress_denied", "dst", e.Deny.compact().strings())
	}
	if len(e.Ports) > 0 {
		acl("egress_ports", "port", e.Ports.strings())
	}
	b.WriteString("http_access deny manager\n")
	if len(e.Allowance) > 0 {
		fmt.Fprintf(&b, "http_access allow egress_allowance %s\n", admit)
	}
	if len(e.Deny) > 0 {
		b.WriteString("http_access deny egress_denied\n")
	}
	if len(e.Ports) > 0 {
		b.WriteString("http_access deny !egress_ports\n")
	}
	fmt.Fprintf(&b, "http_access allow %s\nhttp_access deny all\n", admit)
	return b.String()
}

func chunks(s []string, n int) [][]string {
	var out [][]string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// compact drops the prefixes another holds: Squid ignores them, warning.
func (d DenyList) compact() DenyList {
	var out DenyList
	for i, p := range d {
		inner := slices.ContainsFunc(d, func(q netip.Prefix) bool {
			return q != p && q.Bits() <= p.Bits() && q.Contains(p.Addr())
		}) || slices.Index(d, p) < i
		if !inner {
			out = append(out, p)
		}
	}
	return out
}

func (d DenyList) strings() []string {
	out := make([]string, len(d))
	for i, p := range d {
		out[i] = p.String()
	}
	return out
}

// PortRange is an inclusive range of TCP ports.
type PortRange struct{ Lo, Hi uint16 }

// Ports is a set of port ranges.
type Ports []PortRange

// ParsePorts reads "80,443,8000-8999"; the error names the bad entry.
func ParsePorts(s string) (Ports, error) {
	var ps Ports
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		if !isRange {
			hi = lo
		}
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return nil, fmt.Errorf("%q is not a port (1-65535) or a range such as 8000-8999", f)
		}
		ps = append(ps, PortRange{uint16(l), uint16(h)})
	}
	return ps, nil
}

// Has reports whether port is in ps.
func (ps Ports) Has(port uint16) bool {
	return slices.ContainsFunc(ps, func(r PortRange) bool { return r.Lo <= port && port <= r.Hi })
}

func (ps Ports) strings() []string {
	out := make([]string, len(ps))
	for i, r := range ps {
		out[i] = strconv.Itoa(int(r.Lo))
		if r.Hi != r.Lo {
			out[i] += "-" + strconv.Itoa(int(r.Hi))
		}
	}
	return out
}

// String is ps as ParsePorts reads it.
func (ps Ports) String() string { return strings.Join(ps.strings(), ",") }

// EgressFlags are the egress policy's flags, the same in every service
// that enforces it (the chart passes each the same values).
type EgressFlags struct{ Deny, Allowance, Ports, TLSPorts string }

// Register adds --egress-deny-cidrs, --egress-allowance-cidrs,
// --egress-ports and --egress-tls-ports to fs.
func (f *EgressFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Deny, "egress-deny-cidrs", DefaultEgressDenyCIDRs+","+DefaultClusterCIDRs, "comma-separated CIDRs no proxy takes a client to and no probe targets, checked on resolved addresses: add the cluster's pod and Service CIDRs")
	fs.StringVar(&f.Allowance, "egress-allowance-cidrs", "", "comma-separated CIDRs let through whatever --egress-deny-cidrs and the ports say: an ALLOWANCE for test targets (loopback, an in-cluster test Service), never for production")
	fs.StringVar(&f.Ports, "egress-ports", DefaultEgressPorts, "comma-separated ports and ranges a client may reach through a proxy")
	fs.StringVar(&f.TLSPorts, "egress-tls-ports", DefaultEgressTLSPorts, "comma-separated ports and ranges a client may CONNECT to through a proxy")
}

// Parse is ParseEgress of the flags' values; the error names the flag.
func (f *EgressFlags) Parse() (Egress, error) {
	e, err := ParseEgress(f.Deny, f.Allowance, f.Ports, f.TLSPorts)
	if err != nil {
		return e, fmt.Errorf("--%w", err)
	}
	return e, nil
}

// Destination is where a proxy is asked to take a request for u: its
// host, its port (the scheme's when none is given) and whether by CONNECT
// (https).
func Destination(u *url.URL) (host string, port uint16, connect bool) {
	connect = u.Scheme == "https"
	port = 80
	if connect {
		port = 443
	}
	if n, err := strconv.ParseUint(u.Port(), 10, 16); err == nil {
		port = uint16(n)
	}
	return u.Hostname(), port, connect
}

// Control is a net.Dialer Control function holding the controller's own
// fetches (a ProxySource's URL) to e, on the address actually dialled,
// so a name that resolves inside cannot get round it.
func (e Egress) Control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dialling %s: %w", address, err)
	}
	return e.Check(ap.Addr(), ap.Port(), false)
}
