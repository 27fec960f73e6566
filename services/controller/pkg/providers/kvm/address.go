package kvm

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"strings"

	libvirt "github.com/digitalocean/go-libvirt"
)

// The sources of a VM's address, asked in this order; the first that
// knows wins:
//
//  1. libvirt's DHCP leases, for a host `network`: libvirt's own dnsmasq
//     handed the address out, so it is authoritative and costs one call.
//     Nothing for a `bridge`, whose DHCP server is elsewhere.
//  2. the guest agent, with installGuestAgent: the guest's own view, right
//     on any network, but only once the agent runs inside it.
//  3. the host's neighbour table, over SSH (`ip -4 neigh`): works with
//     no cooperation from the guest, but only once the guest has talked
//     through the host, and an entry can outlive the address. Read over
//     SSH rather than through libvirt's ARP source, which libvirt 9.0
//     cannot parse on current kernels ("wrong nlmsg len").
const (
	sourceLease = 0
	sourceAgent = 1
)

// address returns the VM's IPv4 address, or "" while no source knows it.
func (p *Provider) address(ctx context.Context, h *host, name, domXML string) string {
	nics, err := macs(domXML)
	if err != nil || len(nics) == 0 {
		return ""
	}
	ours := map[string]bool{}
	for _, m := range nics {
		ours[m] = true
	}
	fromLibvirt := func(source uint32) string {
		var ifaces []libvirt.DomainInterface
		err := h.inDomain(ctx, laneRPC, "DomainInterfaceAddresses", name, func(l *libvirt.Libvirt, d libvirt.Domain) error {
			ifaces, err = l.DomainInterfaceAddresses(d, source, 0)
			return err
		})
		if err != nil {
			return ""
		}
		for _, i := range ifaces {
			if len(i.Hwaddr) == 0 || !ours[strings.ToLower(i.Hwaddr[0])] {
				continue
			}
			for _, a := range i.Addrs {
				if ip := net.ParseIP(a.Addr); ip != nil && ip.To4() != nil && !ip.IsLoopback() {
					return a.Addr
				}
			}
		}
		return ""
	}
	if h.cfg.Network != "" {
		if ip := fromLibvirt(sourceLease); ip != "" {
			return ip
		}
	}
	if p.cfg.InstallGuestAgent {
		if ip := fromLibvirt(sourceAgent); ip != "" {
			return ip
		}
	}
	out, err := h.exec(ctx, "ip -4 neigh show")
	if err != nil {
		p.log.Debug("reading the host's neighbour table", "host", h.name, "err", err)
		return ""
	}
	return fromNeighbours(out, ours)
}

// fromNeighbours finds a usable entry for one of macs in `ip -4 neigh
// show` output ("<ip> dev <dev> lladdr <mac> <STATE>").
func fromNeighbours(out []byte, macs map[string]bool) string {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		state := f[len(f)-1]
		if state == "FAILED" || state == "INCOMPLETE" {
			continue
		}
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "lladdr" && macs[strings.ToLower(f[i+1])] && net.ParseIP(f[0]).To4() != nil {
				return f[0]
			}
		}
	}
	return ""
}
