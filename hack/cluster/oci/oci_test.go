package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		out[h.Name] = data
	}
}

func sha(b []byte) string { return fmt.Sprintf("sha256:%x", sha256.Sum256(b)) }

// The layout is what `ctr images import` reads: index.json names the
// image and its manifest, whose config and layer are blobs with the
// digests and sizes given, and the config's diff_id is the digest of the
// uncompressed layer.
func TestLayoutIsConsistentAndReproducible(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "prog")
	require.NoError(t, os.WriteFile(bin, []byte("#!not really\n"), 0o755))
	img := &Image{Name: "egress-proxies.local/x:dev", Entrypoint: []string{"/prog"}, User: "65532:65532", Files: []File{
		{Path: "/prog", Source: bin},
		{Path: "/etc/passwd", Data: []byte("root:x:0:0::/:/x\n")},
		{Path: "/usr/bin/sh", Link: "dash"},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
	}}
	var a, b bytes.Buffer
	da, err := img.WriteLayout(&a)
	require.NoError(t, err)
	db, err := img.WriteLayout(&b)
	require.NoError(t, err)
	assert.Equal(t, da, db, "the same files make the same image")
	assert.Equal(t, a.Bytes(), b.Bytes())

	files := untar(t, a.Bytes())
	assert.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	m := index.Manifests[0]
	assert.Equal(t, da, m.Digest)
	assert.Equal(t, "egress-proxies.local/x:dev", m.Annotations["io.containerd.image.name"])
	assert.Equal(t, "dev", m.Annotations["org.opencontainers.image.ref.name"])
	blob := func(d descriptor) []byte {
		b, ok := files["blobs/sha256/"+d.Digest[len("sha256:"):]]
		require.True(t, ok, "blob %s", d.Digest)
		assert.Equal(t, d.Digest, sha(b))
		assert.EqualValues(t, d.Size, len(b))
		return b
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(blob(m), &manifest))
	var config struct {
		Config struct {
			User       string
			Entrypoint []string
		} `json:"config"`
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	require.NoError(t, json.Unmarshal(blob(manifest.Config), &config))
	assert.Equal(t, "65532:65532", config.Config.User)
	assert.Equal(t, []string{"/prog"}, config.Config.Entrypoint)
	require.Len(t, manifest.Layers, 1)
	zr, err := gzip.NewReader(bytes.NewReader(blob(manifest.Layers[0])))
	require.NoError(t, err)
	layer, err := io.ReadAll(zr)
	require.NoError(t, err)
	assert.Equal(t, []string{sha(layer)}, config.RootFS.DiffIDs)

	// Parents first, in path order, with the modes and links given.
	tr := tar.NewReader(bytes.NewReader(layer))
	var names []string
	modes := map[string]int64{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		modes[h.Name] = h.Mode
		if h.Name == "usr/bin/sh" {
			assert.Equal(t, byte(tar.TypeSymlink), h.Typeflag)
			assert.Equal(t, "dash", h.Linkname)
		}
	}
	assert.Equal(t, []string{"etc/", "etc/passwd", "prog", "tmp/", "usr/", "usr/bin/", "usr/bin/sh"}, names)
	assert.EqualValues(t, 0o755, modes["prog"], "a source file keeps its mode")
	assert.EqualValues(t, 0o1777, modes["tmp/"])
}

func TestAFileGivenTwiceIsAnError(t *testing.T) {
	img := &Image{Name: "x", Files: []File{{Path: "/a", Data: []byte("1")}, {Path: "a", Data: []byte("2")}}}
	_, err := img.Layer()
	assert.ErrorContains(t, err, "/a is given twice")
}

// A program from a Debian package brings the libraries it loads, stored
// under their real directories, and the links that lead there: the
// interpreter every dynamic binary names (/lib64/ld-linux-x86-64.so.2)
// resolves inside the image.
func TestRootfsFollowsLibrariesAndLinks(t *testing.T) {
	if _, err := os.Stat("/bin/dash"); err != nil {
		t.Skip("dash is not installed")
	}
	r := NewRootfs()
	require.NoError(t, r.Add("/bin/dash"))
	byPath := map[string]File{}
	for _, f := range r.Files() {
		byPath[f.Path] = f
	}
	canon, err := filepath.EvalSymlinks("/bin/dash")
	require.NoError(t, err)
	assert.Contains(t, byPath, canon)
	var libc bool
	for p := range byPath {
		if filepath.Base(p) == "libc.so.6" {
			libc = true
		}
	}
	assert.True(t, libc, "libc follows dash: %v", slices.Sorted(maps.Keys(byPath)))
	// The interpreter's path, resolved through the image's own links,
	// ends at a file the image holds.
	real := resolveIn(t, byPath, "/lib64/ld-linux-x86-64.so.2")
	require.Contains(t, byPath, real)
	assert.NotEmpty(t, byPath[real].Source, real)
}

// resolveIn follows links inside the image, component by component.
func resolveIn(t *testing.T, files map[string]File, p string) string {
	for range 40 {
		cur, changed := "/", false
		parts := strings.Split(strings.TrimPrefix(filepath.Clean(p), "/"), "/")
		for i, part := range parts {
			next := filepath.Join(cur, part)
			if f, ok := files[next]; ok && f.Link != "" {
				target := f.Link
				if !filepath.IsAbs(target) {
					target = filepath.Join(cur, target)
				}
				p = filepath.Join(append([]string{target}, parts[i+1:]...)...)
				changed = true
				break
			}
			cur = next
		}
		if !changed {
			return cur
		}
	}
	t.Fatalf("%s: too many links", p)
	return ""
}

func TestPackagesNamesAMissingPackage(t *testing.T) {
	err := NewRootfs().Packages("no-such-package-egress-proxies")
	assert.ErrorContains(t, err, "dpkg -L no-such-package-egress-proxies")
}
