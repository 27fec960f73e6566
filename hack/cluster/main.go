// Command cluster runs a real single-node Kubernetes on this machine, built
// from source (hack/cluster/bins.sh), with every image built here:
//
//	cluster up --bins DIR      start it (or find it running) and print its kubeconfig and kubectl
//	cluster images --bins DIR  build the project's images and load them into the node
//	cluster save --out DIR     write an install's images as OCI archives (make images)
//	cluster down --bins DIR    stop it and undo everything it did to the host
//
// `make cluster-up`, `make cluster-images` and `make cluster-down` run these.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/egress-proxies/egress-proxies/hack/cluster/addons"
	"github.com/egress-proxies/egress-proxies/hack/cluster/images"
	"github.com/egress-proxies/egress-proxies/hack/cluster/node"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	bins := fs.String("bins", "", "directory of the cluster's binaries (bash hack/cluster/bins.sh prints it)")
	repo := fs.String("repo", ".", "the repository's root, whose services the images are built from")
	tag := fs.String("tag", images.DevTag, "tag of the project's images")
	out := fs.String("out", "bin/images", "save: the directory the OCI archives are written to")
	_ = fs.Parse(os.Args[2:])
	if os.Args[1] == "save" {
		if err := saveImages(*repo, *out, *tag); err != nil {
			fmt.Fprintln(os.Stderr, "cluster:", err)
			os.Exit(1)
		}
		return
	}
	if *bins == "" && os.Args[1] != "down" {
		fmt.Fprintln(os.Stderr, "--bins is required: the directory bash hack/cluster/bins.sh prints")
		os.Exit(2)
	}
	cfg := node.Defaults(*bins)
	var err error
	switch os.Args[1] {
	case "up":
		err = up(cfg)
	case "status":
		if !cfg.Running() {
			fmt.Println("cluster: not running")
			os.Exit(1)
		}
		printAccess(cfg, "running")
	case "images":
		err = projectImages(cfg, *repo, *tag)
	case "down":
		start := time.Now()
		err = cfg.Down(step)
		if err == nil {
			fmt.Printf("cluster: down in %s\n", time.Since(start).Round(100*time.Millisecond))
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: cluster up|status|images|down --bins DIR [--repo DIR] [--tag TAG]\n       cluster save [--out DIR] [--repo DIR] [--tag TAG]")
	os.Exit(2)
}

// saveImages writes an install's images (the three services, Squid,
// Redis, curl) as OCI archives into out, for a cluster with no way to
// build or pull them: each node imports them (ctr images import), or any
// OCI tool copies them into a registry.
func saveImages(repo, out, tag string) error {
	dir, err := os.MkdirTemp("", "save-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	imgs, err := images.Install(repo, dir, tag)
	if err != nil {
		return err
	}
	paths, err := images.Save(out, imgs...)
	if err != nil {
		return err
	}
	for i, p := range paths {
		fmt.Printf("%s  %s\n", p, imgs[i].Name)
	}
	return nil
}

func step(s string) { fmt.Fprintf(os.Stderr, "cluster: %s\n", s) }

func up(cfg node.Config) error {
	start := time.Now()
	if cfg.Running() {
		printAccess(cfg, "running")
		return nil
	}
	if cfg.Exists() {
		step("a cluster that is not running was left on this host: removing it first")
		if err := cfg.Down(step); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := func() error {
		if err := cfg.Up(ctx, func() error { return systemImages(cfg) }, step); err != nil {
			return err
		}
		step("addons: CoreDNS, local-path StorageClass")
		return applyAddons(ctx, cfg)
	}()
	if err != nil {
		// An interrupted or failed start leaves nothing behind.
		fmt.Fprintln(os.Stderr, "cluster: start failed:", err)
		logs := filepath.Join(os.TempDir(), "egress-proxies-cluster-logs")
		if cfg.SaveLogs(logs) == nil {
			fmt.Fprintln(os.Stderr, "cluster: the components' logs are kept in", logs)
		}
		if derr := cfg.Down(step); derr != nil {
			fmt.Fprintln(os.Stderr, "cluster: clean-up:", derr)
		}
		return err
	}
	printAccess(cfg, fmt.Sprintf("up in %s", time.Since(start).Round(100*time.Millisecond)))
	return nil
}

func printAccess(cfg node.Config, state string) {
	fmt.Printf("cluster: %s (node %s, API %s)\n", state, cfg.NodeName, cfg.Server())
	fmt.Printf("kubeconfig: %s\n", cfg.Kubeconfig())
	fmt.Printf("kubectl: %s\n", cfg.Kubectl())
}

// systemImages are what the node runs of its own: the pod sandbox, DNS,
// the volume provisioner and its helper.
func systemImages(cfg node.Config) error {
	dir, err := os.MkdirTemp("", "cluster-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pause, err := images.GoBuild(".", dir, "./hack/cluster/cmd/pause")
	if err != nil {
		return err
	}
	busybox, err := images.Busybox(images.SystemTag)
	if err != nil {
		return err
	}
	return images.Import(cfg.Ctr(),
		images.Static("pause", "3.10", pause, images.Nonroot),
		images.Static("coredns", images.SystemTag, filepath.Join(cfg.Bins, "coredns"), 0),
		images.Static("local-path-provisioner", images.SystemTag, filepath.Join(cfg.Bins, "local-path-provisioner"), 0),
		busybox)
}

func applyAddons(ctx context.Context, cfg node.Config) error {
	manifests, err := addons.Render(addons.Values{
		DNSIP:            cfg.DNSIP(),
		CoreDNSImage:     images.Ref("coredns", images.SystemTag),
		ProvisionerImage: images.Ref("local-path-provisioner", images.SystemTag),
		HelperImage:      images.Ref("busybox", images.SystemTag),
		Path:             cfg.LocalPath(),
	})
	if err != nil {
		return err
	}
	if err := cfg.Apply(manifests); err != nil {
		return err
	}
	for _, d := range []string{"kube-system/coredns", "local-path-storage/local-path-provisioner"} {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := cfg.Rollout(d, 2*time.Minute); err != nil {
			return err
		}
	}
	return nil
}

// projectImages builds the three services, Squid, Redis, curl and the
// end-to-end test's programs, and loads them into the node.
func projectImages(cfg node.Config, repo, tag string) error {
	if !cfg.Running() {
		return fmt.Errorf("no cluster is running: make cluster-up first")
	}
	start := time.Now()
	dir, err := os.MkdirTemp("", "project-images-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	imgs, err := images.Project(repo, dir, tag)
	if err != nil {
		return err
	}
	if err := images.Import(cfg.Ctr(), imgs...); err != nil {
		return err
	}
	fmt.Printf("cluster: %d images built and loaded in %s:\n", len(imgs), time.Since(start).Round(100*time.Millisecond))
	for _, img := range imgs {
		fmt.Printf("  %s\n", img.Name)
	}
	return nil
}
