package images

import (
	"fmt"
	"os/exec"
	"path/filepath"

	"github.com/egress-proxies/egress-proxies/hack/cluster/oci"
)

// DevTag tags the project's images, as the Makefile's TAG does; SystemTag
// the node's own.
const (
	DevTag    = "dev"
	SystemTag = "local"
)

// Project builds every image an install on the cluster runs: the three
// services (with `make build`, the Makefile's static build, whose flags a
// test holds equal to the Dockerfile's), Squid, Redis, curl, and the
// end-to-end test's target and crawler. The binaries are built into dir,
// which must outlive the images' import.
func Project(repo, dir, tag string) ([]*oci.Image, error) {
	imgs, err := Install(repo, dir, tag)
	if err != nil {
		return nil, err
	}
	for _, prog := range []string{"target", "crawler"} {
		bin, err := GoBuild(repo, dir, "./hack/cluster/cmd/"+prog)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, Static("e2e-"+prog, tag, bin, Nonroot))
	}
	return imgs, nil
}

// Install builds the images an install runs: the three services, Squid
// (the kubernetes provider's pods), Redis (the bundled one) and curl (the
// helm test).
func Install(repo, dir, tag string) ([]*oci.Image, error) {
	make := exec.Command("make", "--no-print-directory", "build", "BIN="+dir)
	make.Dir = repo
	if out, err := make.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("make build: %w: %s", err, out)
	}
	var imgs []*oci.Image
	for _, s := range []string{"controller", "prober", "broker"} {
		imgs = append(imgs, Service(s, filepath.Join(dir, s), tag))
	}
	for _, mk := range []func(string) (*oci.Image, error){Squid, Redis, Curl} {
		img, err := mk(tag)
		if err != nil {
			return nil, err
		}
		imgs = append(imgs, img)
	}
	return imgs, nil
}
