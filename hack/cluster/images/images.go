// Package images makes every image the cluster runs, none of them pulled:
// the project's three services from the same static build the Dockerfile
// does, the node's own (pause, CoreDNS, local-path-provisioner and its
// helper), Squid, Redis and curl from this machine's Debian packages, and
// the end-to-end test's target and crawler. Import loads them into the
// node's containerd.
package images

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/egress-proxies/egress-proxies/hack/cluster/oci"
)

// Registry prefixes every image built here: a name no registry serves, so
// a missing image fails fast instead of pulling something else.
const Registry = "egress-proxies.local"

// Ref is the reference of an image built here.
func Ref(name, tag string) string { return Registry + "/" + name + ":" + tag }

// Nonroot is the distroless images' user, which the Dockerfile's
// final stage runs as.
const Nonroot = 65532

// static is a distroless-like base for a static binary: accounts, CA
// roots, a writable /tmp, and no shell.
func static(name, binary, entry string, user int) *oci.Image {
	files := append(oci.Accounts(map[string]int{"nonroot": Nonroot, "nobody": 65534}),
		oci.File{Path: "/etc/ssl/certs/ca-certificates.crt", Source: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644},
		oci.File{Path: "/tmp", Dir: true, Mode: 0o1777},
		oci.File{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: Nonroot, GID: Nonroot},
		oci.File{Path: entry, Source: binary, Mode: 0o755},
	)
	return &oci.Image{
		Name: name, Files: files, Entrypoint: []string{entry},
		User: fmt.Sprintf("%d:%d", user, user), WorkingDir: "/",
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
	}
}

// Service is a project service's image as the Dockerfile makes it: the
// static binary at /service, its entrypoint, run as 65532, nothing else.
func Service(service, binary, tag string) *oci.Image {
	return static(Ref("egress-proxies-"+service, tag), binary, "/service", Nonroot)
}

// Static is an image holding one static program of the node's or the
// tests' own (pause, CoreDNS, ...), run as root or nonroot.
func Static(name, tag, binary string, user int) *oci.Image {
	return static(Ref(name, tag), binary, "/usr/local/bin/"+filepath.Base(binary), user)
}

// busyboxApplets are the tools images with a shell get from Debian's
// busybox-static. The shell itself is Debian's dash, as in the images
// these stand in for: Squid starts its helpers with argv[0] "(sh)",
// which busybox cannot dispatch on.
var busyboxApplets = []string{"cat", "sed", "mv", "cp", "rm", "mkdir", "rmdir", "chown", "chmod", "ls", "echo", "test", "[", "sleep", "id", "env", "true", "false", "head", "grep"}

func withShell(r *oci.Rootfs) error {
	if err := r.Add("/bin/busybox"); err != nil {
		return fmt.Errorf("busybox: %w (make deps installs busybox-static)", err)
	}
	if err := r.Add("/bin/dash"); err != nil {
		return err
	}
	r.Put(oci.File{Path: "/usr/bin/sh", Link: "dash"})
	for _, a := range busyboxApplets {
		r.Put(oci.File{Path: "/usr/bin/" + a, Link: "busybox"})
	}
	return nil
}

func debianImage(name string, users map[string]int, pkgs []string, shell bool) (*oci.Rootfs, error) {
	r := oci.NewRootfs()
	if err := r.Packages(pkgs...); err != nil {
		return nil, fmt.Errorf("image %s: %w", name, err)
	}
	if shell {
		if err := withShell(r); err != nil {
			return nil, err
		}
	}
	for _, f := range oci.Accounts(users) {
		r.Put(f)
	}
	r.Put(oci.File{Path: "/tmp", Dir: true, Mode: 0o1777})
	return r, nil
}

// Busybox is local-path-provisioner's helper (it runs a shell script to
// make and remove each volume's directory).
func Busybox(tag string) (*oci.Image, error) {
	r, err := debianImage("busybox", nil, nil, true)
	if err != nil {
		return nil, err
	}
	return &oci.Image{Name: Ref("busybox", tag), Files: r.Files(), Cmd: []string{"sh"}}, nil
}

// Squid is the kubernetes provider's Squid: Debian's, with what the
// provider's pods need of an image, as ubuntu/squid has it: Squid at
// /usr/sbin/squid, its user 13, and /bin/sh for the auth helper. The pod
// gives the command and the whole config.
func Squid(tag string) (*oci.Image, error) {
	r, err := debianImage("squid", map[string]int{"proxy": 13}, []string{"squid", "squid-common", "squid-langpack"}, true)
	if err != nil {
		return nil, err
	}
	return &oci.Image{Name: Ref("squid", tag), Files: r.Files(), Entrypoint: []string{"/usr/sbin/squid"}, Cmd: []string{"-NYC", "-d", "1"}, Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}, nil
}

// Redis is Debian's redis-server, with redis-cli for the chart's
// readiness probe, run as the chart's 999.
func Redis(tag string) (*oci.Image, error) {
	r, err := debianImage("redis", map[string]int{"redis": 999}, []string{"redis-server", "redis-tools"}, false)
	if err != nil {
		return nil, err
	}
	r.Put(oci.File{Path: "/data", Dir: true, Mode: 0o755, UID: 999, GID: 999})
	return &oci.Image{Name: Ref("redis", tag), Files: r.Files(), Entrypoint: []string{"redis-server"}, WorkingDir: "/data", Env: []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}}, nil
}

// Curl is what the chart's `helm test` pod runs (sh -ec 'curl ...').
func Curl(tag string) (*oci.Image, error) {
	r, err := debianImage("curl", map[string]int{"nonroot": Nonroot}, []string{"curl", "ca-certificates"}, true)
	if err != nil {
		return nil, err
	}
	// ca-certificates ships the bundle from its maintainer script.
	r.Put(oci.File{Path: "/etc/ssl/certs/ca-certificates.crt", Source: "/etc/ssl/certs/ca-certificates.crt"})
	return &oci.Image{Name: Ref("curl", tag), Files: r.Files(), Entrypoint: []string{"curl"}, User: fmt.Sprintf("%d:%d", Nonroot, Nonroot), Env: []string{"PATH=/usr/bin:/bin"}}, nil
}

// Import writes each image as an OCI layout and loads it into the node's
// containerd with ctr (ctr is the command and its connection flags).
func Import(ctr []string, imgs ...*oci.Image) error {
	for _, img := range imgs {
		var buf bytes.Buffer
		if _, err := img.WriteLayout(&buf); err != nil {
			return fmt.Errorf("image %s: %w", img.Name, err)
		}
		cmd := exec.Command(ctr[0], append(ctr[1:], "images", "import", "--label", "io.cri-containerd.image=managed", "-")...)
		cmd.Stdin = &buf
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("importing %s: %w: %s", img.Name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// Save writes each image as an OCI layout archive into dir, named after
// the image's last path element (egress-proxies-controller.tar), and
// returns the files' paths in the images' order. An archive is what
// `ctr images import` loads and what skopeo (oci-archive:) or crane
// pushes to a registry.
func Save(dir string, imgs ...*oci.Image) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var paths []string
	for _, img := range imgs {
		name, _, _ := strings.Cut(img.Name[strings.LastIndex(img.Name, "/")+1:], ":")
		path := filepath.Join(dir, name+".tar")
		f, err := os.Create(path)
		if err != nil {
			return nil, err
		}
		_, err = img.WriteLayout(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// GoBuild builds a static program of this repository into dir, with the
// flags of the Makefile's build target.
func GoBuild(repo, dir, pkg string) (string, error) {
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return out, nil
}
