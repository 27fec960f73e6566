package broker

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/dns/dnsmessage"
)

// dnsServer is a DNS server on loopback (UDP) that knows the names it is
// given and answers NXDOMAIN for every other: the gateway resolves
// destinations with it (--gateway-dns), so a test crawls named hosts,
// and names that do not resolve, without a query leaving the machine.
type dnsServer struct {
	addr  string
	mu    sync.Mutex
	names map[string][]netip.Addr
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = pc.Close() })
	d := &dnsServer{addr: pc.LocalAddr().String(), names: map[string][]netip.Addr{}}
	go d.serve(pc)
	return d
}

// set makes name resolve to ips (IPv4 ones, answered in this order).
func (d *dnsServer) set(name string, ips ...netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.names[strings.ToLower(strings.TrimSuffix(name, "."))] = ips
}

func (d *dnsServer) serve(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil || len(m.Questions) == 0 {
			continue
		}
		q := m.Questions[0]
		m.Header.Response, m.Header.Authoritative, m.Header.RecursionAvailable = true, true, true
		d.mu.Lock()
		ips, ok := d.names[strings.ToLower(strings.TrimSuffix(q.Name.String(), "."))]
		d.mu.Unlock()
		m.Answers = nil
		if !ok {
			m.Header.RCode = dnsmessage.RCodeNameError
		}
		for _, ip := range ips {
			if q.Type == dnsmessage.TypeA && ip.Is4() {
				m.Answers = append(m.Answers, dnsmessage.Resource{
					Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 5},
					Body:   &dnsmessage.AResource{A: ip.As4()},
				})
			}
		}
		out, err := m.Pack()
		if err != nil {
			continue
		}
		_, _ = pc.WriteTo(out, from)
	}
}
