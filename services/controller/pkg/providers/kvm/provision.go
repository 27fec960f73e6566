package kvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	libvirt "github.com/digitalocean/go-libvirt"
	"go.opentelemetry.io/otel/trace"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// errSeedLost: a domain defined by a create that crashed before its seed
// volume was written. Its cloud-init is gone with that request, so the VM
// is Failed and the reconciler replaces it.
var errSeedLost = errors.New("the seed volume is missing (a create was interrupted before writing it)")

// ensureSeed writes the NoCloud seed volume unless it exists. It runs in
// Create, the one place that has the request's cloud-init; the ISO is only
// built when the volume is missing.
func (p *Provider) ensureSeed(ctx context.Context, h *host, req *providers.CreateRequest) error {
	name := seedVolume(req.Name)
	err := p.inPool(ctx, h, laneRPC, "StorageVolUpload", func(l *libvirt.Libvirt, pool libvirt.StoragePool) error {
		if _, err := l.StorageVolLookupByName(pool, name); err == nil {
			return nil
		}
		files, err := seedFiles(req.Name, req.CloudInit, p.cfg.VendorData, p.cfg.InstallGuestAgent)
		if err != nil {
			return err
		}
		iso, err := seedISO(files)
		if err != nil {
			return err
		}
		volXML, err := volumeXML(name, "raw", uint64(len(iso)), "", "")
		if err != nil {
			return err
		}
		vol, err := l.StorageVolCreateXML(pool, volXML, 0)
		if err != nil {
			return err
		}
		if err := l.StorageVolUpload(vol, bytes.NewReader(iso), 0, uint64(len(iso)), 0); err != nil {
			_ = l.StorageVolDelete(vol, 0)
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("writing the seed volume %s: %w", name, err)
	}
	return nil
}

// provision brings a defined domain up: base image, disk overlay, start.
// Every step is idempotent, so it resumes wherever a crash stopped it.
func (p *Provider) provision(ctx context.Context, h *host, name string, t *tags) error {
	base, err := p.ensureImage(ctx, h, t.Image)
	if err != nil {
		return err
	}
	disk := diskVolume(name)
	overlay, err := volumeXML(disk, "qcow2", uint64(p.cfg.DiskSizeGb)<<30, base.path, base.format)
	if err != nil {
		return err
	}
	var seedMissing bool
	err = p.inPool(ctx, h, laneBulk, "StorageVolCreateXML", func(l *libvirt.Libvirt, pool libvirt.StoragePool) error {
		if _, err := l.StorageVolLookupByName(pool, seedVolume(name)); isLibvirt(err, libvirt.ErrNoStorageVol) {
			seedMissing = true
			return nil
		}
		if _, err := l.StorageVolLookupByName(pool, disk); err == nil {
			return nil
		}
		_, err = l.StorageVolCreateXML(pool, overlay, 0)
		return err
	})
	if err != nil {
		return fmt.Errorf("creating the disk overlay %s: %w", disk, err)
	}
	if seedMissing {
		return h.errorf("domain %s: %w", name, errSeedLost)
	}
	started := *t
	started.Started = true
	err = h.inDomain(ctx, laneBulk, "DomainCreate", name, func(l *libvirt.Libvirt, d libvirt.Domain) error {
		state, _, err := l.DomainGetState(d, 0)
		if err != nil {
			return err
		}
		if libvirt.DomainState(state) != libvirt.DomainRunning {
			if err := l.DomainCreate(d); err != nil {
				return err
			}
		}
		// Both the live and the persistent definition: the mark must
		// survive the VM stopping, which is when Get reads it.
		return l.DomainSetMetadata(d, int32(libvirt.DomainMetadataElement), libvirt.OptString{started.xml()},
			libvirt.OptString{metadataKey}, libvirt.OptString{p.gen.metadataURI}, libvirt.DomainAffectLive|libvirt.DomainAffectConfig)
	})
	if err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	return nil
}

// precheckPool refuses a create the pool has no room for, as the
// contract's quota kind, so the reconciler waits instead of failing: the
// VM's whole disk must fit (an overlay grows up to it, and a full pool
// stops every VM on it). An image not cached yet is not counted: its size
// is known only once its download starts.
func (p *Provider) precheckPool(ctx context.Context, h *host, image string) error {
	need := uint64(p.cfg.DiskSizeGb) << 30
	var available uint64
	err := p.inPool(ctx, h, laneRPC, "StoragePoolGetInfo", func(l *libvirt.Libvirt, pool libvirt.StoragePool) (err error) {
		// The refresh counts space used outside libvirt. libvirt refuses
		// it while any volume of the pool is being built or uploaded
		// (another VM provisioning), and keeps its own figures current
		// for those: then the figures as they stand are the answer.
		_ = l.StoragePoolRefresh(pool, 0)
		_, _, _, available, err = l.StoragePoolGetInfo(pool)
		return err
	})
	if err != nil {
		return err
	}
	if available < need {
		return providers.NewQuota(h.errorf("storage pool %s has %s free; a VM needs %s (diskSizeGb) for image %s",
			h.cfg.Pool, gib(available), gib(need), image))
	}
	return nil
}

func gib(b uint64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// job is one background provisioning (kvm2).
type job struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// jobTimeout bounds one provisioning attempt, a large image download
// included; the next Get starts another.
const jobTimeout = 30 * time.Minute

// startJob provisions the domain in the background unless that already
// runs. Get calls it too, so a controller restarted mid-provisioning
// resumes on its first poll. The job outlives the caller's context but
// joins its trace, so its RPC spans sit under the Create (or Get) that
// started it.
func (p *Provider) startJob(caller context.Context, h *host, name string, t *tags) {
	id := p.ProviderID(h.name, name)
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.jobs[id]; ok {
		return
	}
	ctx, cancel := context.WithTimeout(trace.ContextWithSpanContext(p.ctx, trace.SpanContextFromContext(caller)), jobTimeout)
	j := &job{cancel: cancel, done: make(chan struct{})}
	p.jobs[id] = j
	go func() {
		defer cancel()
		j.err = p.provision(ctx, h, name, t)
		if j.err != nil {
			p.log.Warn("provisioning failed", "instance", id, "err", j.err)
		}
		close(j.done)
	}()
}

// jobState is what Get reports for a domain not yet started: Pending while
// its job runs (starting one if none does), the job's error once, and
// Failed when the seed was lost.
func (p *Provider) jobState(ctx context.Context, h *host, name string, t *tags) (providers.InstanceState, error) {
	id := p.ProviderID(h.name, name)
	p.mu.Lock()
	j, ok := p.jobs[id]
	p.mu.Unlock()
	if !ok {
		p.startJob(ctx, h, name, t)
		return providers.StatePending, nil
	}
	select {
	case <-j.done:
	default:
		return providers.StatePending, nil
	}
	p.mu.Lock()
	delete(p.jobs, id)
	p.mu.Unlock()
	switch {
	case errors.Is(j.err, errSeedLost):
		return providers.StateFailed, nil
	case j.err != nil:
		// Reported once; the next Get tries again.
		return "", j.err
	}
	return providers.StatePending, nil
}

// stopJob cancels the background provisioning of id and waits for it, so
// Delete never races a job that is still creating volumes.
func (p *Provider) stopJob(ctx context.Context, id string) {
	p.mu.Lock()
	j, ok := p.jobs[id]
	delete(p.jobs, id)
	p.mu.Unlock()
	if !ok {
		return
	}
	j.cancel()
	select {
	case <-j.done:
	case <-ctx.Done():
	}
}
