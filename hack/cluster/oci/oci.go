// Package oci assembles container images without Docker or a registry: a
// file tree packed as one layer, written as an OCI image layout tar that
// `ctr images import` takes. Entries are written in path order with fixed
// times and owners, so the same tree always makes the same digest.
package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"
)

// File is one entry of an image's file system.
type File struct {
	// Path is absolute inside the image (/usr/bin/squid).
	Path string
	// Exactly one of Data, Source, Link or Dir says what it is.
	Data   []byte // the content
	Source string // a host file whose content it takes
	Link   string // a symbolic link to this target
	Dir    bool
	Mode   int64 // permission bits; 0 means 0644 for files, 0755 for directories
	UID    int
	GID    int
}

// Image is what an image is made of.
type Image struct {
	// Name is the reference containerd files it under
	// (egress-proxies.local/controller:dev).
	Name       string
	Files      []File
	Entrypoint []string
	Cmd        []string
	User       string
	Env        []string
	WorkingDir string
	Labels     map[string]string
}

// epoch is every entry's time: images are built from the same bytes to
// the same digest.
var epoch = time.Unix(0, 0).UTC()

// Layer writes the image's file system as an uncompressed tar. Parent
// directories are added where the files leave them out.
func (img *Image) Layer() ([]byte, error) {
	entries := map[string]File{}
	for _, f := range img.Files {
		p := path.Clean("/" + f.Path)
		if p == "/" {
			continue
		}
		f.Path = p
		if prev, ok := entries[p]; ok && !(prev.Dir && f.Dir) {
			return nil, fmt.Errorf("image %s: %s is given twice", img.Name, p)
		}
		entries[p] = f
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		f := entries[p]
		hdr := &tar.Header{
			Name: strings.TrimPrefix(p, "/"), ModTime: epoch, Uid: f.UID, Gid: f.GID,
			Format: tar.FormatPAX, Mode: f.Mode,
		}
		var data []byte
		switch {
		case f.Dir:
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			if hdr.Mode == 0 {
				hdr.Mode = 0o755
			}
		case f.Link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Mode = tar.TypeSymlink, f.Link, 0o777
		case f.Source != "":
			b, err := os.ReadFile(f.Source)
			if err != nil {
				return nil, fmt.Errorf("image %s: %w", img.Name, err)
			}
			data = b
			if hdr.Mode == 0 {
				st, err := os.Stat(f.Source)
				if err != nil {
					return nil, err
				}
				hdr.Mode = int64(st.Mode().Perm())
			}
		default:
			data = f.Data
			if hdr.Mode == 0 {
				hdr.Mode = 0o644
			}
		}
		if hdr.Typeflag == 0 {
			hdr.Typeflag, hdr.Size = tar.TypeReg, int64(len(data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func digest(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }

// WriteLayout writes the image as an OCI image layout tar to w and
// returns its manifest's digest.
func (img *Image) WriteLayout(w io.Writer) (string, error) {
	layer, err := img.Layer()
	if err != nil {
		return "", err
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	if _, err := zw.Write(layer); err != nil {
		return "", err
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      epoch.Format(time.RFC3339),
		"config": map[string]any{
			"User": img.User, "Env": img.Env, "Entrypoint": img.Entrypoint, "Cmd": img.Cmd,
			"WorkingDir": img.WorkingDir, "Labels": img.Labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{digest(layer)}},
		"history": []map[string]any{{"created": epoch.Format(time.RFC3339), "created_by": "egress-proxies hack/cluster/oci"}},
	})
	if err != nil {
		return "", err
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor{MediaType: "application/vnd.oci.image.config.v1+json", Digest: digest(config), Size: int64(len(config))},
		"layers":        []descriptor{{MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Digest: digest(gz.Bytes()), Size: int64(gz.Len())}},
	})
	if err != nil {
		return "", err
	}
	_, tag, _ := strings.Cut(img.Name[strings.LastIndex(img.Name, "/")+1:], ":")
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []descriptor{{
			MediaType: "application/vnd.oci.image.manifest.v1+json", Digest: digest(manifest), Size: int64(len(manifest)),
			Annotations: map[string]string{"io.containerd.image.name": img.Name, "org.opencontainers.image.ref.name": tag},
		}},
	})
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(w)
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blob(config), config},
		{blob(gz.Bytes()), gz.Bytes()},
		{blob(manifest), manifest},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return "", err
		}
		if _, err := tw.Write(f.data); err != nil {
			return "", err
		}
	}
	return digest(manifest), tw.Close()
}

func blob(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:") }
