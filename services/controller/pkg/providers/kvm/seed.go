package kvm

import (
	"bytes"
	"fmt"
	"mime/multipart"
	"net/textproto"
	"os"
	"path/filepath"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"
)

// guestAgentVendorData installs and starts qemu-guest-agent, so Get can
// ask the guest for its address.
const guestAgentVendorData = `#cloud-config
packages: [qemu-guest-agent]
runcmd:
  - [systemctl, enable, --now, qemu-guest-agent]
`

// seedFiles are the NoCloud files for one VM: user-data from the Proxy,
// meta-data naming the instance (cloud-init runs once per instance-id),
// and vendor-data from the config, with the guest agent added when asked.
func seedFiles(name string, userData []byte, vendorData string, guestAgent bool) (map[string][]byte, error) {
	if len(userData) == 0 {
		userData = []byte("#cloud-config\n{}\n")
	}
	files := map[string][]byte{
		"user-data": userData,
		"meta-data": fmt.Appendf(nil, "instance-id: %s\nlocal-hostname: %s\n", name, name),
	}
	var parts []string
	if vendorData != "" {
		parts = append(parts, vendorData)
	}
	if guestAgent {
		parts = append(parts, guestAgentVendorData)
	}
	switch len(parts) {
	case 0:
	case 1:
		files["vendor-data"] = []byte(parts[0])
	default:
		mp, err := multipartCloudConfig(parts)
		if err != nil {
			return nil, err
		}
		files["vendor-data"] = mp
	}
	return files, nil
}

// multipartCloudConfig joins cloud-configs the way cloud-init merges them:
// a MIME multipart message of text/cloud-config parts.
func multipartCloudConfig(parts []string) ([]byte, error) {
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	for _, p := range parts {
		pw, err := w.CreatePart(textproto.MIMEHeader{"Content-Type": {"text/cloud-config"}})
		if err != nil {
			return nil, err
		}
		if _, err := pw.Write([]byte(p)); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	head := fmt.Sprintf("Content-Type: multipart/mixed; boundary=%q\nMIME-Version: 1.0\n\n", w.Boundary())
	return append([]byte(head), body.Bytes()...), nil
}

// seedISO builds the NoCloud seed: an ISO 9660 image with volume id
// "cidata" and Rock Ridge names (plain ISO 9660 would turn user-data into
// USER_DAT, which cloud-init does not look for).
func seedISO(files map[string][]byte) ([]byte, error) {
	dir, err := os.MkdirTemp("", "egress-proxies-seed-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "seed.iso")
	var size int64 = 1 << 20
	for _, b := range files {
		size += int64(len(b)) + 2048
	}
	store, err := file.CreateFromPath(path, size)
	if err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	defer store.Close()
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o700); err != nil {
		return nil, err
	}
	fs, err := iso9660.Create(store, size, 0, 2048, work)
	if err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	for _, name := range sortedKeys(files) {
		f, err := fs.OpenFile("/"+name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return nil, fmt.Errorf("seed ISO %s: %w", name, err)
		}
		if _, err := f.Write(files[name]); err != nil {
			return nil, fmt.Errorf("seed ISO %s: %w", name, err)
		}
	}
	if err := fs.Finalize(iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: "cidata"}); err != nil {
		return nil, fmt.Errorf("seed ISO: %w", err)
	}
	return os.ReadFile(path)
}
