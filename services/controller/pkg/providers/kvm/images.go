package kvm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"

	libvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// baseVolumeName is the pool volume a configured image is cached in. The
// checksum is part of it, so a new image version is a new volume and VMs
// on the old one keep their backing file.
func baseVolumeName(image string, img Image) string {
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, strings.ToLower(image))
	return "egress-proxies-image-" + clean + "-" + img.sha256Hex()[:12]
}

// verifiedMarker is an empty volume created once a base volume's content
// matched its checksum. libvirt cannot rename volumes, so an upload cut
// short by a crash leaves a base volume without it, which the next
// download replaces instead of trusting.
func verifiedMarker(base string) string { return base + ".verified" }

// baseImage is a base volume on one host.
type baseImage struct {
	path, format string
}

// ensureImage returns the base volume for placement.image on h, first
// downloading a configured image into the pool. Concurrent callers for the
// same image and host share one download.
func (p *Provider) ensureImage(ctx context.Context, h *host, image string) (*baseImage, error) {
	img, configured := p.cfg.Images[image]
	if !configured {
		// Not one of ours to download: it must be in the pool already.
		return p.readBase(ctx, h, image, image)
	}
	base := baseVolumeName(image, img)
	key := h.name + "/" + base
	p.mu.Lock()
	f, ok := p.downloads[key]
	if !ok {
		f = &flight{done: make(chan struct{})}
		p.downloads[key] = f
		go func() {
			// The download belongs to no one reconcile: a cancelled
			// caller must not cut it short for the others waiting.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), jobTimeout)
			f.err = p.download(dctx, h, image, img, base)
			cancel()
			p.mu.Lock()
			delete(p.downloads, key)
			p.mu.Unlock()
			close(f.done)
		}()
	}
	p.mu.Unlock()
	select {
	case <-f.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if f.err != nil {
		return nil, f.err
	}
	return p.readBase(ctx, h, image, base)
}

type flight struct {
	done chan struct{}
	err  error
}

// readBase reads the base volume name of placement.image on h. An image
// larger than diskSizeGb is refused: an overlay smaller than its backing
// file cuts the guest's disk short, and no retry can fix that.
func (p *Provider) readBase(ctx context.Context, h *host, image, name string) (*baseImage, error) {
	var volXML string
	err := p.inPool(ctx, h, laneRPC, "StorageVolGetXMLDesc", func(l *libvirt.Libvirt, pool libvirt.StoragePool) error {
		vol, err := l.StorageVolLookupByName(pool, name)
		if err != nil {
			return err
		}
		volXML, err = l.StorageVolGetXMLDesc(vol, 0)
		return err
	})
	if isLibvirt(err, libvirt.ErrNoStorageVol) {
		return nil, providers.NewInvalidConfig("spec.placement.image %q is neither an image of provider %q (images: %s) nor a volume in pool %q on host %s",
			name, p.entry, strings.Join(sortedKeys(p.cfg.Images), ", "), h.cfg.Pool, h.name)
	}
	if err != nil {
		return nil, err
	}
	v := &libvirtxml.StorageVolume{}
	if err := v.Unmarshal(volXML); err != nil {
		return nil, h.errorf("reading volume %s: %w", name, err)
	}
	b := &baseImage{format: "raw"}
	if v.Target != nil {
		b.path = v.Target.Path
		if v.Target.Format != nil && v.Target.Format.Type != "" {
			b.format = v.Target.Format.Type
		}
	}
	// libvirt describes volumes it reads in bytes.
	if v.Capacity != nil && (v.Capacity.Unit == "" || v.Capacity.Unit == "bytes") {
		if size, disk := v.Capacity.Value, uint64(p.cfg.DiskSizeGb)<<30; size > disk {
			return nil, providers.NewInvalidConfig("spec.placement.image %q (volume %s on host %s) is %s, more than diskSizeGb %d of provider %q: a VM's disk cannot be smaller than its image; raise diskSizeGb",
				image, name, h.name, gib(size), p.cfg.DiskSizeGb, p.entry)
		}
	}
	return b, nil
}

// inPool runs call with the host's storage pool; a pool that does not
// exist is the config error it is, naming the field.
func (p *Provider) inPool(ctx context.Context, h *host, l lane, rpc string, call func(*libvirt.Libvirt, libvirt.StoragePool) error) error {
	err := h.do(ctx, l, rpc, func(lv *libvirt.Libvirt) error {
		pool, err := lv.StoragePoolLookupByName(h.cfg.Pool)
		if err != nil {
			return err
		}
		return call(lv, pool)
	})
	if isLibvirt(err, libvirt.ErrNoStoragePool) {
		return providers.NewInvalidConfig("host %s of provider %q has no storage pool %q (hosts.%s.pool)", h.name, p.entry, h.cfg.Pool, h.name)
	}
	return err
}

var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// download streams the image from its URL into a new volume on the bulk
// lane, hashing as it goes, and marks the volume verified only when the
// hash matches the config.
func (p *Provider) download(ctx context.Context, h *host, image string, img Image, base string) error {
	exists := func(name string) (bool, error) {
		err := p.inPool(ctx, h, laneBulk, "StorageVolLookupByName", func(l *libvirt.Libvirt, pool libvirt.StoragePool) error {
			_, err := l.StorageVolLookupByName(pool, name)
			return err
		})
		if isLibvirt(err, libvirt.ErrNoStorageVol) {
			return false, nil
		}
		return err == nil, err
	}
	if ok, err := exists(verifiedMarker(base)); err != nil || ok {
		return err
	}
	// A base volume without its marker is an upload that never finished.
	if err := p.deleteVolumes(ctx, h, laneBulk, base); err != nil {
		return err
	}

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, img.URL, nil)
	if err != nil {
		return providers.NewInvalidConfig("images.%s.url %q: %v", image, img.URL, err)
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return fmt.Errorf("downloading image %s from %s: %w", image, img.URL, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return providers.NewInvalidConfig("images.%s.url %s answered %s", image, img.URL, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("downloading image %s from %s: %s", image, img.URL, resp.Status)
	case resp.ContentLength <= 0:
		return providers.NewInvalidConfig("images.%s.url %s sent no Content-Length; libvirt needs the size before the upload", image, img.URL)
	}
	body := bufio.NewReader(resp.Body)
	format := "raw"
	if magic, _ := body.Peek(len(qcow2Magic)); bytes.Equal(magic, qcow2Magic) {
		format = "qcow2"
	}
	size := uint64(resp.ContentLength)
	volXML, err := volumeXML(base, format, size, "", "")
	if err != nil {
		return err
	}
	hash := sha256.New()
	err = p.inPool(ctx, h, laneBulk, "StorageVolUpload", func(l *libvirt.Libvirt, pool libvirt.StoragePool) error {
		vol, err := l.StorageVolCreateXML(pool, volXML, 0)
		if err != nil {
			return err
		}
		return l.StorageVolUpload(vol, io.TeeReader(io.LimitReader(body, int64(size)), hash), 0, size, 0)
	})
	if err != nil {
		_ = p.deleteVolumes(context.WithoutCancel(ctx), h, laneBulk, base)
		return fmt.Errorf("uploading image %s into pool %s: %w", image, h.cfg.Pool, err)
	}
	if got := hex.EncodeToString(hash.Sum(nil)); got != img.sha256Hex() {
		_ = p.deleteVolumes(ctx, h, laneBulk, base)
		return providers.NewInvalidConfig("image %s from %s has sha256:%s, but images.%s.checksum is %s: refusing to use it",
			image, img.URL, got, image, img.Checksum)
	}
	markerXML, err := volumeXML(verifiedMarker(base), "raw", 0, "", "")
	if err != nil {
		return err
	}
	return p.inPool(ctx, h, laneBulk, "StorageVolCreateXML", func(l *libvirt.Libvirt, pool libvirt.StoragePool) error {
		_, err = l.StorageVolCreateXML(pool, markerXML, 0)
		return err
	})
}

// deleteVolumes deletes the named volumes of h's pool; absent ones are
// skipped.
func (p *Provider) deleteVolumes(ctx context.Context, h *host, l lane, names ...string) error {
	return p.inPool(ctx, h, l, "StorageVolDelete", func(lv *libvirt.Libvirt, pool libvirt.StoragePool) error {
		for _, n := range names {
			vol, err := lv.StorageVolLookupByName(pool, n)
			if isLibvirt(err, libvirt.ErrNoStorageVol) {
				continue
			}
			if err != nil {
				return err
			}
			if err := lv.StorageVolDelete(vol, 0); err != nil && !isLibvirt(err, libvirt.ErrNoStorageVol) {
				return err
			}
		}
		return nil
	})
}
