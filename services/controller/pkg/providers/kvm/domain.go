package kvm

import (
	"encoding/xml"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"libvirt.org/go/libvirtxml"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Volumes a VM owns are named after its domain, so Delete finds them from
// the providerID alone, even once the domain is gone.
func diskVolume(domain string) string { return domain + "-disk.qcow2" }
func seedVolume(domain string) string { return domain + "-seed.iso" }

// metadataKey is the XML prefix of our <metadata> element.
const metadataKey = "egress-proxies"

// tags is the ownership record kept in each domain's <metadata>: libvirt
// has no labels, and a domain's XML is the one place that lives and dies
// with it.
type tags struct {
	XMLName    xml.Name `xml:"instance"`
	ManagedBy  string   `xml:"managedBy"`
	Provider   string   `xml:"provider"`
	OwnerUID   string   `xml:"ownerUID"`
	Owner      string   `xml:"owner"`
	Generation int64    `xml:"generation"`
	// CreatedAt is written once, when the domain is defined, and read
	// back for orphan GC's grace period.
	CreatedAt string `xml:"createdAt"`
	// Image is placement.image: what provisioning resumes with.
	Image string `xml:"image"`
	// Started is set once the VM first started: a shut-off domain without
	// it is still being provisioned, with it the VM stopped (Failed).
	Started bool `xml:"started,omitempty"`
}

func newTags(entry string, o providers.Owner, image string, now time.Time) *tags {
	return &tags{
		ManagedBy: providers.ManagedByValue, Provider: entry, OwnerUID: string(o.UID),
		Owner: o.Key(), Generation: o.Generation,
		CreatedAt: now.UTC().Format(time.RFC3339), Image: image,
	}
}

// xml renders the element libvirt stores under our namespace URI.
func (t *tags) xml() string {
	b, _ := xml.Marshal(t)
	return string(b)
}

// element renders it with the namespace, as it sits inside <metadata>.
func (t *tags) element(uri string) string {
	inner := strings.TrimSuffix(strings.TrimPrefix(t.xml(), "<instance>"), "</instance>")
	return fmt.Sprintf(`<%s:instance xmlns:%s=%q>%s</%s:instance>`, metadataKey, metadataKey, uri, inner, metadataKey)
}

func parseTags(s string) (*tags, error) {
	t := &tags{}
	if err := xml.Unmarshal([]byte(s), t); err != nil {
		return nil, fmt.Errorf("reading our metadata: %w", err)
	}
	return t, nil
}

// instance is the Pending instance the tags describe; callers that read
// the domain's state set it.
func (t *tags) instance(id, name string) *providers.Instance {
	ns, owner, _ := strings.Cut(t.Owner, "/")
	created, _ := time.Parse(time.RFC3339, t.CreatedAt)
	return &providers.Instance{ProviderID: id, Name: name, State: providers.StatePending, CreatedAt: created,
		Owner: providers.Owner{UID: types.UID(t.OwnerUID), Namespace: ns, Name: owner, Generation: t.Generation}}
}

// domainSpec is what a VM is made of.
type domainSpec struct {
	name       string
	domainType string // kvm where the host offers it, else qemu
	machine    MachineType
	host       Host
	tags       *tags
	metaURI    string
	guestAgent bool
}

// domainXML is the VM: its disk an overlay volume, cloud-init a NoCloud
// seed CD-ROM, one virtio NIC on the host's bridge or network, a serial
// console, and the guest agent's channel when asked for.
func (s *domainSpec) domainXML() (string, error) {
	volume := func(dev, bus, vol, format, device string) libvirtxml.DomainDisk {
		d := libvirtxml.DomainDisk{
			Device: device,
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
			Source: &libvirtxml.DomainDiskSource{Volume: &libvirtxml.DomainDiskSourceVolume{Pool: s.host.Pool, Volume: vol}},
			Target: &libvirtxml.DomainDiskTarget{Dev: dev, Bus: bus},
		}
		if device == "cdrom" {
			d.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		return d
	}
	nic := libvirtxml.DomainInterface{Model: &libvirtxml.DomainInterfaceModel{Type: "virtio"}}
	if s.host.Bridge != "" {
		nic.Source = &libvirtxml.DomainInterfaceSource{Bridge: &libvirtxml.DomainInterfaceSourceBridge{Bridge: s.host.Bridge}}
	} else {
		nic.Source = &libvirtxml.DomainInterfaceSource{Network: &libvirtxml.DomainInterfaceSourceNetwork{Network: s.host.Network}}
	}
	d := &libvirtxml.Domain{
		Type:     s.domainType,
		Name:     s.name,
		Metadata: &libvirtxml.DomainMetadata{XML: s.tags.element(s.metaURI)},
		Memory:   &libvirtxml.DomainMemory{Value: uint(s.machine.MemoryMiB), Unit: "MiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: uint(s.machine.VCPUs)},
		OS:       &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Type: "hvm"}},
		Features: &libvirtxml.DomainFeatureList{ACPI: &libvirtxml.DomainFeature{}, APIC: &libvirtxml.DomainFeatureAPIC{}},
		// A guest that powers off or crashes stays off: Get reports it
		// Failed and the reconciler replaces it (cattle, not pets).
		OnPoweroff: "destroy", OnCrash: "destroy", OnReboot: "restart",
		Devices: &libvirtxml.DomainDeviceList{
			Disks: []libvirtxml.DomainDisk{
				volume("vda", "virtio", diskVolume(s.name), "qcow2", "disk"),
				volume("hdc", "ide", seedVolume(s.name), "raw", "cdrom"),
			},
			Interfaces: []libvirtxml.DomainInterface{nic},
			Serials:    []libvirtxml.DomainSerial{{Source: &libvirtxml.DomainChardevSource{Pty: &libvirtxml.DomainChardevSourcePty{}}}},
		},
	}
	if s.guestAgent {
		d.Devices.Channels = []libvirtxml.DomainChannel{{
			Source: &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind"}},
			Target: &libvirtxml.DomainChannelTarget{VirtIO: &libvirtxml.DomainChannelTargetVirtIO{Name: "org.qemu.guest_agent.0"}},
		}}
	}
	return d.Marshal()
}

// macs lists the MAC addresses of a domain's NICs, read from its XML.
func macs(domainXML string) ([]string, error) {
	d := &libvirtxml.Domain{}
	if err := d.Unmarshal(domainXML); err != nil {
		return nil, err
	}
	var out []string
	if d.Devices != nil {
		for _, i := range d.Devices.Interfaces {
			if i.MAC != nil {
				out = append(out, strings.ToLower(i.MAC.Address))
			}
		}
	}
	return out, nil
}

// preferredDomainType picks kvm when the host offers it for x86_64 hvm
// guests, else qemu (software emulation), from its capabilities XML.
func preferredDomainType(capsXML string) (string, error) {
	caps := &libvirtxml.Caps{}
	if err := caps.Unmarshal(capsXML); err != nil {
		return "", fmt.Errorf("reading host capabilities: %w", err)
	}
	offered := map[string]bool{}
	for _, g := range caps.Guests {
		if g.OSType == "hvm" && g.Arch.Name == "x86_64" {
			for _, d := range g.Arch.Domains {
				offered[d.Type] = true
			}
		}
	}
	for _, t := range []string{"kvm", "qemu"} {
		if offered[t] {
			return t, nil
		}
	}
	return "", fmt.Errorf("the host offers neither kvm nor qemu for x86_64 guests (is libvirt-daemon-driver-qemu installed?)")
}

// volumeXML is a volume of capacity bytes; backing, when set, makes it a
// copy-on-write overlay of that path.
func volumeXML(name, format string, capacity uint64, backingPath, backingFormat string) (string, error) {
	v := &libvirtxml.StorageVolume{
		Name:     name,
		Capacity: &libvirtxml.StorageVolumeSize{Unit: "bytes", Value: capacity},
		Target:   &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: format}},
	}
	if backingPath != "" {
		v.BackingStore = &libvirtxml.StorageVolumeBackingStore{
			Path: backingPath, Format: &libvirtxml.StorageVolumeTargetFormat{Type: backingFormat},
		}
	}
	return v.Marshal()
}
