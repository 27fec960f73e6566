// Package kvm holds the kvm and kvm2 providers: libvirt VMs on the user's
// own hypervisors, reached over SSH. Each VM's disk is a copy-on-write
// overlay of a base image cached in the host's storage pool, cloud-init
// reaches it as a NoCloud seed CD-ROM, and its NIC sits on the host's
// bridge or libvirt network, so each host's uplink is a distinct egress.
//
// One libvirt core serves both types; generation.go is everything in
// which they differ. libvirt RPC is spoken by go-libvirt over an SSH
// channel to the host's libvirt socket (the cgo bindings are not served
// here), and XML is built with libvirtxml.
package kvm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// The providers-config types this package builds.
const (
	Type  = "kvm"
	Type2 = "kvm2"
)

// New is the Factory of type kvm.
func New(ctx context.Context, e providers.Entry, deps providers.Deps) (providers.Provider, error) {
	return newProvider(ctx, e, deps, gen1)
}

// New2 is the Factory of type kvm2.
func New2(ctx context.Context, e providers.Entry, deps providers.Deps) (providers.Provider, error) {
	return newProvider(ctx, e, deps, gen2)
}

// Provider runs VMs on the hosts of one providers-config entry.
type Provider struct {
	entry string
	cfg   *Config
	gen   *generation
	hosts map[string]*host
	http  *http.Client
	log   *slog.Logger
	// ctx outlives reconciles: background provisioning runs under it.
	ctx context.Context

	mu        sync.Mutex
	downloads map[string]*flight // host/base volume -> download in flight
	jobs      map[string]*job    // providerID -> background provisioning (kvm2)
}

var _ providers.Provider = (*Provider)(nil)

func newProvider(ctx context.Context, e providers.Entry, deps providers.Deps, gen *generation) (*Provider, error) {
	cfg, err := decodeConfig(e)
	if err != nil {
		return nil, err
	}
	log := deps.Log
	if log == nil {
		log = slog.Default()
	}
	log = log.With("provider", e.Name, "type", gen.typ)
	if cfg.InsecureIgnoreHostKey {
		log.Warn("insecureIgnoreHostKey is set: host keys are not checked, so anyone on the path to a host can impersonate it")
	}
	creds := readCredentials(cfg)
	if gen.rereadCredentials {
		if _, _, err := creds(); err != nil {
			// Read again on every dial: once the Secret is mounted, the
			// next reconcile works without a restart.
			log.Warn("SSH credentials cannot be read yet; Proxies on this entry fail until they can", "err", err)
		}
	} else {
		creds = onceCredentials(creds)
		if _, _, err := creds(); err != nil {
			return nil, &providers.UnavailableError{Entry: e.Name, Err: err}
		}
	}
	p := &Provider{
		entry: e.Name, cfg: cfg, gen: gen, hosts: map[string]*host{}, log: log, ctx: context.WithoutCancel(ctx),
		http:      &http.Client{Transport: http.DefaultTransport},
		downloads: map[string]*flight{}, jobs: map[string]*job{},
	}
	for name, hc := range cfg.Hosts {
		p.hosts[name] = newHost(name, hc, creds, gen, time.Duration(cfg.KeepaliveSeconds)*time.Second)
	}
	return p, nil
}

// ProviderID is "<type>://<host>/<domain>": the host's name in the config
// and the domain's name on it.
func (p *Provider) ProviderID(host, domain string) string {
	return p.gen.typ + "://" + host + "/" + domain
}

// parseID returns the host and domain of id. A host no longer in the
// config is a config error naming it, never NotFound: the VM may well
// still run there.
func (p *Provider) parseID(id string) (*host, string, error) {
	rest, ok := strings.CutPrefix(id, p.gen.typ+"://")
	hostName, domain, _ := strings.Cut(rest, "/")
	if !ok || hostName == "" || domain == "" || strings.Contains(domain, "/") {
		return nil, "", providers.NewInvalidConfig("providerID %q is not %s://<host>/<domain>", id, p.gen.typ)
	}
	h, ok := p.hosts[hostName]
	if !ok {
		return nil, "", providers.NewInvalidConfig("host %q of instance %s is no longer in the hosts of provider %q (hosts: %s); put it back, or annotate the Proxy crawl.example.com/skip-cleanup=true to abandon the VM",
			hostName, domain, p.entry, strings.Join(sortedKeys(p.hosts), ", "))
	}
	return h, domain, nil
}

// placement resolves a request's placement against the config; every
// error names the field and what would have been valid.
func (p *Provider) placement(req *providers.CreateRequest) (*host, MachineType, error) {
	pl := req.Placement
	zone := pl.Zone
	if zone == "" {
		if len(p.hosts) != 1 {
			return nil, MachineType{}, providers.NewInvalidConfig("spec.placement.zone is required by provider %q, which has several hosts: %s",
				p.entry, strings.Join(sortedKeys(p.hosts), ", "))
		}
		zone = sortedKeys(p.hosts)[0]
	}
	h, ok := p.hosts[zone]
	if !ok {
		return nil, MachineType{}, providers.NewInvalidConfig("spec.placement.zone %q names no host of provider %q (hosts: %s)",
			zone, p.entry, strings.Join(sortedKeys(p.hosts), ", "))
	}
	if pl.MachineType == "" {
		return nil, MachineType{}, providers.NewInvalidConfig("spec.placement.machineType is required by provider %q (machineTypes: %s)",
			p.entry, strings.Join(sortedKeys(p.cfg.MachineTypes), ", "))
	}
	mt, ok := p.cfg.MachineTypes[pl.MachineType]
	if !ok {
		return nil, MachineType{}, providers.NewInvalidConfig("spec.placement.machineType %q names no machine type of provider %q (machineTypes: %s)",
			pl.MachineType, p.entry, strings.Join(sortedKeys(p.cfg.MachineTypes), ", "))
	}
	if pl.Image == "" {
		return nil, MachineType{}, providers.NewInvalidConfig("spec.placement.image is required by provider %q (images: %s, or a volume in the host's pool)",
			p.entry, strings.Join(sortedKeys(p.cfg.Images), ", "))
	}
	return h, mt, nil
}

// Create defines the domain first, with its ownership tags, so that a
// crash at any later step leaves a domain that Create resumes, Delete
// cleans up and orphan GC can find; then it writes the seed volume and
// provisions (kvm: now, returning once the VM started; kvm2: in the
// background, the reconciler polling Get).
func (p *Provider) Create(ctx context.Context, req *providers.CreateRequest) (*providers.Instance, error) {
	h, mt, err := p.placement(req)
	if err != nil {
		return nil, err
	}
	id := p.ProviderID(h.name, req.Name)
	t, err := p.readTags(ctx, h, req.Name, nil)
	switch {
	case providers.IsNotFound(err):
		if t, err = p.define(ctx, h, mt, req); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, err
	case t.OwnerUID != string(req.Owner.UID):
		return nil, providers.NewInvalidConfig("domain %s on host %s belongs to another owner (uid %q): refusing to adopt it", req.Name, h.name, t.OwnerUID)
	}
	if err := p.ensureSeed(ctx, h, req); err != nil {
		return nil, err
	}
	if p.gen.asyncCreate {
		p.startJob(ctx, h, req.Name, t)
		return t.instance(id, req.Name), nil
	}
	if err := p.provision(ctx, h, req.Name, t); err != nil {
		return nil, err
	}
	return p.Get(ctx, id)
}

// define checks the image and the pool, then defines the domain.
func (p *Provider) define(ctx context.Context, h *host, mt MachineType, req *providers.CreateRequest) (*tags, error) {
	image := req.Placement.Image
	if _, configured := p.cfg.Images[image]; !configured {
		// Not ours to download: it must be in the pool already.
		if _, err := p.readBase(ctx, h, image, image); err != nil {
			return nil, err
		}
	}
	if p.gen.precheckPool {
		if err := p.precheckPool(ctx, h, image); err != nil {
			return nil, err
		}
	}
	domType, err := p.domainType(ctx, h)
	if err != nil {
		return nil, err
	}
	t := newTags(p.entry, req.Owner, image, time.Now())
	spec := &domainSpec{name: req.Name, domainType: domType, machine: mt, host: h.cfg, tags: t, metaURI: p.gen.metadataURI, guestAgent: p.cfg.InstallGuestAgent}
	domXML, err := spec.domainXML()
	if err != nil {
		return nil, err
	}
	err = h.do(ctx, laneRPC, "DomainDefineXMLFlags", func(l *libvirt.Libvirt) error {
		_, err := l.DomainDefineXMLFlags(domXML, 0)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("defining domain %s: %w", req.Name, err)
	}
	return t, nil
}

// domainType asks the host once which accelerator it offers.
func (p *Provider) domainType(ctx context.Context, h *host) (string, error) {
	h.mu.Lock()
	t := h.domType
	h.mu.Unlock()
	if t != "" {
		return t, nil
	}
	var caps string
	if err := h.do(ctx, laneRPC, "ConnectGetCapabilities", func(l *libvirt.Libvirt) (err error) {
		caps, err = l.ConnectGetCapabilities()
		return err
	}); err != nil {
		return "", err
	}
	t, err := preferredDomainType(caps)
	if err != nil {
		return "", h.errorf("%w", err)
	}
	h.mu.Lock()
	h.domType = t
	h.mu.Unlock()
	return t, nil
}

// readTags reads our ownership tags from the named domain: NotFound when
// there is no such domain, an error when it is not ours (no metadata under
// our URI, or another entry's). more, when set, runs on the same lookup.
func (p *Provider) readTags(ctx context.Context, h *host, name string, more func(*libvirt.Libvirt, libvirt.Domain) error) (*tags, error) {
	var meta string
	err := h.inDomain(ctx, laneRPC, "DomainGetMetadata", name, func(l *libvirt.Libvirt, d libvirt.Domain) (err error) {
		meta, err = l.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{p.gen.metadataURI}, 0)
		if err != nil || more == nil {
			return err
		}
		return more(l, d)
	})
	switch {
	case isLibvirt(err, libvirt.ErrNoDomain):
		return nil, providers.NewNotFound("no domain %s on host %s", name, h.name)
	case isLibvirt(err, libvirt.ErrNoDomainMetadata):
		return nil, providers.NewInvalidConfig("domain %s on host %s exists but carries no %s tags of ours: refusing to touch it", name, h.name, p.gen.typ)
	case err != nil:
		return nil, err
	}
	t, err := parseTags(meta)
	if err != nil {
		return nil, h.errorf("domain %s: %w", name, err)
	}
	if t.Provider != p.entry {
		return nil, providers.NewInvalidConfig("domain %s on host %s belongs to provider %q, not %q: refusing to touch it", name, h.name, t.Provider, p.entry)
	}
	return t, nil
}

// Get reads the domain's state and, once it runs, its address.
func (p *Provider) Get(ctx context.Context, id string) (*providers.Instance, error) {
	h, name, err := p.parseID(id)
	if err != nil {
		return nil, err
	}
	var state int32
	var domXML string
	t, err := p.readTags(ctx, h, name, func(l *libvirt.Libvirt, d libvirt.Domain) (err error) {
		if state, _, err = l.DomainGetState(d, 0); err != nil {
			return err
		}
		domXML, err = l.DomainGetXMLDesc(d, 0)
		return err
	})
	if err != nil {
		return nil, err
	}
	inst := t.instance(id, name)
	switch libvirt.DomainState(state) {
	case libvirt.DomainRunning:
		inst.State = providers.StateRunning
		inst.IP = p.address(ctx, h, name, domXML)
	case libvirt.DomainShutdown:
		inst.State = providers.StateTerminating
	case libvirt.DomainShutoff:
		if t.Started || !p.gen.asyncCreate {
			// Stopped after it ran, or a kvm create that never finished
			// (kvm's Create returns only once the VM runs): replace it.
			inst.State = providers.StateFailed
			break
		}
		state, err := p.jobState(ctx, h, name, t)
		if err != nil {
			return nil, err
		}
		inst.State = state
	case libvirt.DomainCrashed, libvirt.DomainPmsuspended:
		inst.State = providers.StateFailed
	}
	return inst, nil
}

// Delete stops the VM, deletes the volumes it owns, then undefines it:
// the domain goes last, so a crash part-way leaves it (and its tags) for
// the next Delete or orphan GC to finish. A domain already gone still has
// its volumes removed.
func (p *Provider) Delete(ctx context.Context, id string) error {
	h, name, err := p.parseID(id)
	if err != nil {
		return err
	}
	p.stopJob(ctx, id)
	if _, err := p.readTags(ctx, h, name, nil); err != nil && !providers.IsNotFound(err) {
		return err
	}
	err = h.inDomain(ctx, laneRPC, "DomainDestroyFlags", name, func(l *libvirt.Libvirt, d libvirt.Domain) error {
		if state, _, err := l.DomainGetState(d, 0); err == nil && libvirt.DomainState(state) != libvirt.DomainShutoff {
			if err := l.DomainDestroyFlags(d, 0); err != nil && !isLibvirt(err, libvirt.ErrOperationInvalid) {
				return err
			}
		}
		return nil
	})
	if err != nil && !isLibvirt(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("stopping %s: %w", name, err)
	}
	if err := p.deleteVolumes(ctx, h, laneRPC, diskVolume(name), seedVolume(name)); err != nil {
		return fmt.Errorf("deleting the volumes of %s: %w", name, err)
	}
	err = h.inDomain(ctx, laneRPC, "DomainUndefineFlags", name, func(l *libvirt.Libvirt, d libvirt.Domain) error {
		return l.DomainUndefineFlags(d, libvirt.DomainUndefineManagedSave|libvirt.DomainUndefineSnapshotsMetadata|libvirt.DomainUndefineNvram)
	})
	if err != nil && !isLibvirt(err, libvirt.ErrNoDomain) {
		return fmt.Errorf("undefining %s: %w", name, err)
	}
	return nil
}

// listTimeout bounds how long List waits for one host, so one hung host
// does not stall orphan GC for the others.
const listTimeout = 30 * time.Second

// List reads every host in parallel. A host that cannot be read is named
// in the returned error and its VMs are left out, never reported absent.
func (p *Provider) List(ctx context.Context) ([]*providers.Instance, error) {
	type result struct {
		insts []*providers.Instance
		err   error
	}
	results := make(chan result, len(p.hosts))
	for _, h := range p.hosts {
		go func() {
			ctx, cancel := context.WithTimeout(ctx, listTimeout)
			defer cancel()
			insts, err := p.listHost(ctx, h)
			results <- result{insts, err}
		}()
	}
	var out []*providers.Instance
	var errs []error
	for range p.hosts {
		r := <-results
		out = append(out, r.insts...)
		if r.err != nil {
			errs = append(errs, r.err)
		}
	}
	return out, errors.Join(errs...)
}

func (p *Provider) listHost(ctx context.Context, h *host) ([]*providers.Instance, error) {
	if err := p.checkHost(ctx, h); err != nil {
		return nil, err
	}
	var out []*providers.Instance
	err := h.do(ctx, laneRPC, "ConnectListAllDomains", func(l *libvirt.Libvirt) error {
		doms, _, err := l.ConnectListAllDomains(1, libvirt.ConnectListDomainsPersistent)
		if err != nil {
			return err
		}
		for _, d := range doms {
			meta, err := l.DomainGetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{p.gen.metadataURI}, 0)
			if isLibvirt(err, libvirt.ErrNoDomainMetadata, libvirt.ErrNoDomain) {
				continue // not ours, or gone since the listing
			}
			if err != nil {
				return fmt.Errorf("reading the metadata of %s: %w", d.Name, err)
			}
			t, err := parseTags(meta)
			if err != nil || t.Provider != p.entry || t.OwnerUID == "" {
				continue
			}
			out = append(out, t.instance(p.ProviderID(h.name, d.Name), d.Name))
		}
		return nil
	})
	return out, err
}

// checkHost is a cheap call on the check lane: an unreachable host fails
// here within the dial timeout instead of inside a longer listing.
func (p *Provider) checkHost(ctx context.Context, h *host) error {
	return h.do(ctx, laneCheck, "ConnectGetLibVersion", func(l *libvirt.Libvirt) error {
		_, err := l.ConnectGetLibVersion()
		return err
	})
}
