// Package netpolicy is where traffic may not go, in two lists. The egress
// policy (Egress) is where a proxy may take a client: never inside the
// network it runs in (private ranges, the cluster, loopback, the metadata
// service); the Squid config of the kubernetes provider's pods, the
// prober's probe targets and the lease API's gateway all enforce it. The
// proxy-address list (DefaultDenyCIDRs) is where a Proxy itself may not
// be: proxies live in private ranges, so it holds only link-local, where a
// Proxy pointed at the metadata service would have the probe fleet fetch
// from it.
package netpolicy

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
)

// DefaultDenyCIDRs: the link-local ranges, which hold every cloud's
// metadata service on IPv4 (169.254.169.254) and the node's own
// link-local services, and AWS's IPv6 metadata address.
const DefaultDenyCIDRs = "169.254.0.0/16,fe80::/10,fd00:ec2::254/128"

// DenyList is a set of prefixes no probe may reach.
type DenyList []netip.Prefix

// Parse reads a comma-separated list of CIDRs; "" is an empty list. The
// error names the first bad entry.
func Parse(s string) (DenyList, error) {
	var d DenyList
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR such as 169.254.0.0/16", f)
		}
		d = append(d, p.Masked())
	}
	return d, nil
}

// String is the list as Parse reads it.
func (d DenyList) String() string { return strings.Join(d.strings(), ",") }

// Denies returns the prefix that holds ip, if any.
// An address with a zone (fe80::1%eth0) is judged without it: a zone
// names an interface, not another address.
func (d DenyList) Denies(ip netip.Addr) (netip.Prefix, bool) {
	ip = ip.Unmap().WithZone("")
	for _, p := range d {
		if p.Contains(ip) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// DeniesHost is Denies for a host that may be a name: a name is not
// resolved here (whoever dials it checks the address it resolves to).
func (d DenyList) DeniesHost(host string) (netip.Prefix, bool) {
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil {
		return netip.Prefix{}, false
	}
	return d.Denies(ip)
}

// DeniedError says a destination was refused: its address is in a deny
// list (Prefix), or Why says what else is wrong with it (its port).
type DeniedError struct {
	Addr   netip.Addr
	Prefix netip.Prefix
	Why    string
}

func (e *DeniedError) Error() string {
	if e.Why != "" {
		return fmt.Sprintf("%s: %s", e.Addr, e.Why)
	}
	return fmt.Sprintf("%s is in the deny list (%s)", e.Addr, e.Prefix)
}

// Control is a net.Dialer Control function refusing denied addresses. It
// sees the address after name resolution, so a host name that resolves
// into a denied range is refused too.
func (d DenyList) Control(_, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return err
	}
	if p, denied := d.Denies(ip); denied {
		return &DeniedError{Addr: ip.Unmap().WithZone(""), Prefix: p}
	}
	return nil
}
