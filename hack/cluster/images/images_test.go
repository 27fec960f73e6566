package images

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// dockerfile is the repository's Dockerfile with continued lines joined.
func dockerfile(t *testing.T) string {
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Dockerfile"))
	require.NoError(t, err)
	return strings.ReplaceAll(string(b), "\\\n", " ")
}

// buildFlags are a go build's flags as a set, with the commit variable
// written one way ($(GIT_COMMIT) and ${GIT_COMMIT} alike).
func buildFlags(t *testing.T, line string) []string {
	t.Helper()
	line = strings.NewReplacer("${GIT_COMMIT}", "COMMIT", "$(GIT_COMMIT)", "COMMIT", `"`, "", "'", "").Replace(line)
	i := strings.Index(line, "go build")
	require.GreaterOrEqual(t, i, 0, "no go build in %q", line)
	args, _, _ := strings.Cut(line[i+len("go build"):], ";")
	var flags []string
	for _, f := range strings.Fields(args) {
		if strings.HasPrefix(f, "-o") || strings.HasPrefix(f, "./") || strings.HasPrefix(f, "/") || strings.HasPrefix(f, "$(BIN)") {
			continue
		}
		flags = append(flags, f)
	}
	if strings.Contains(line[:i], "CGO_ENABLED=0") {
		flags = append(flags, "CGO_ENABLED=0")
	}
	return flags
}

// The images the real cluster runs are built by `make build` (Project
// runs it) and packed without Docker; the Dockerfile is what users build.
// The two recipes must make the same binary and run it the same way.
func TestServiceImagesMatchTheDockerfile(t *testing.T) {
	df := dockerfile(t)
	var run string
	for _, line := range strings.Split(df, "\n") {
		if strings.Contains(line, "go build") {
			run = line
		}
	}
	mk, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "Makefile"))
	require.NoError(t, err)
	makefile := string(mk)
	ldflags := regexp.MustCompile(`(?m)^LDFLAGS := (.*)$`).FindStringSubmatch(makefile)
	require.NotNil(t, ldflags, "the Makefile's LDFLAGS")
	var build string
	for _, line := range strings.Split(makefile, "\n") {
		if strings.Contains(line, "go build") && strings.Contains(line, "$(LDFLAGS)") {
			build = strings.ReplaceAll(line, "$(LDFLAGS)", ldflags[1])
		}
	}
	require.NotEmpty(t, build, "the Makefile's build recipe")
	assert.ElementsMatch(t, buildFlags(t, run), buildFlags(t, build), "Dockerfile: %s\nMakefile: %s", run, build)

	entry := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindStringSubmatch(df)
	user := regexp.MustCompile(`(?m)^USER (\S+)`).FindStringSubmatch(df)
	require.NotNil(t, entry)
	require.NotNil(t, user)
	bin := filepath.Join(t.TempDir(), "broker")
	require.NoError(t, os.WriteFile(bin, []byte("binary"), 0o755))
	img := Service("broker", bin, "dev")
	assert.Equal(t, []string{entry[1]}, img.Entrypoint)
	assert.Equal(t, user[1], img.User)
	assert.Equal(t, "egress-proxies.local/egress-proxies-broker:dev", img.Name)
	for _, f := range img.Files {
		assert.NotContains(t, []string{"/bin/sh", "/usr/bin/sh", "/bin/busybox"}, f.Path, "no shell, as distroless has none")
	}
}

// Save writes each image as an OCI archive named after it, which holds
// the layout containerd imports and registries take: oci-layout, and an
// index naming the image.
func TestSaveWritesOneOCIArchivePerImage(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "service")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/true\n"), 0o755))
	dir := filepath.Join(t.TempDir(), "images")
	paths, err := Save(dir, Service("broker", bin, "v9"), Service("prober", bin, "v9"))
	require.NoError(t, err)
	assert.Equal(t, []string{filepath.Join(dir, "egress-proxies-broker.tar"), filepath.Join(dir, "egress-proxies-prober.tar")}, paths)
	f, err := os.Open(paths[0])
	require.NoError(t, err)
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		files[h.Name] = b
	}
	assert.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))
	var index struct {
		Manifests []struct{ Annotations map[string]string }
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	assert.Equal(t, Ref("egress-proxies-broker", "v9"), index.Manifests[0].Annotations["io.containerd.image.name"])
	assert.Equal(t, "v9", index.Manifests[0].Annotations["org.opencontainers.image.ref.name"])
}
