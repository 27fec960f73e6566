package node

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/hack/cluster/pki"
)

// Running says whether a cluster is up: every process alive and the API
// server ready.
func (c Config) Running() bool {
	for _, p := range c.components() {
		if !c.running(p.name) {
			return false
		}
	}
	return c.apiReady() == nil
}

// Exists says whether anything of a cluster is on the host, running or
// not: what Down would clean.
func (c Config) Exists() bool {
	_, err := os.Stat(c.State)
	return err == nil
}

// Up brings the control plane and the node up and waits until the node
// is Ready. images imports the images the node needs before the kubelet
// starts (the pause image at least). It leaves the processes running;
// on failure the caller runs Down.
func (c Config) Up(ctx context.Context, images func() error, step func(string)) error {
	if os.Geteuid() != 0 {
		return errors.New("a node needs root: it makes a bridge, iptables chains, mounts and cgroups")
	}
	for _, tool := range []string{"iptables", "ip6tables", "ip", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed (make deps installs it)", tool)
		}
	}
	if found := foreignChains(); len(found) > 0 {
		return fmt.Errorf("another node's iptables chains exist (%s): run make cluster-down, or stop that node", strings.Join(found, ", "))
	}
	for _, d := range []string{c.State, c.Run, c.pki(), c.LocalPath()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// First of all: what the host is like, so Down can put it back even
	// if Up fails past this point.
	if err := c.writeRecord(); err != nil {
		return err
	}
	step("network: bridge " + c.Bridge + " " + c.NodeIP() + ", pods " + c.PodCIDR.String() + ", services " + c.ServiceCIDR.String())
	if err := c.network(); err != nil {
		return err
	}
	if err := c.certificates(); err != nil {
		return err
	}
	for path, content := range map[string]string{
		filepath.Join(c.State, "containerd.toml"):                   c.containerdConfig(),
		filepath.Join(c.cniConfDir(), "10-egress-proxies.conflist"): c.cniConfig(),
		filepath.Join(c.State, "kubelet.yaml"):                      c.kubeletConfig(),
		filepath.Join(c.State, "kube-proxy.yaml"):                   c.kubeProxyConfig(),
		filepath.Join(c.registryDir(), "_default", "hosts.toml"):    noRegistry,
	} {
		if err := writeFile(path, content); err != nil {
			return err
		}
	}
	for _, p := range c.components() {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		step("start " + p.name)
		if err := c.start(p); err != nil {
			return err
		}
		if err := c.ready(ctx, p.name, images); err != nil {
			return err
		}
	}
	step("wait for the node to be Ready")
	return c.waitFor(ctx, "node "+c.NodeName+" Ready", "kubelet", 2*time.Minute, func() error {
		out, err := c.KubectlOutput("get", "node", c.NodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if out != "True" {
			return fmt.Errorf("Ready is %q", out)
		}
		return nil
	})
}

// ready waits for a just-started component to serve.
func (c Config) ready(ctx context.Context, name string, images func() error) error {
	switch name {
	case "etcd":
		return c.waitFor(ctx, "etcd's health", name, time.Minute, func() error {
			return get(nil, fmt.Sprintf("http://127.0.0.1:%d/health", etcdPort))
		})
	case "kube-apiserver":
		return c.waitFor(ctx, "the API server's /readyz", name, 2*time.Minute, c.apiReady)
	case "containerd":
		if err := c.waitFor(ctx, "containerd's socket", name, time.Minute, func() error {
			_, err := os.Stat(c.containerdSock())
			return err
		}); err != nil {
			return err
		}
		return images()
	case "kube-controller-manager":
		// The service-account token controller is what pods wait for.
		return c.waitFor(ctx, "the default ServiceAccount", name, 2*time.Minute, func() error {
			_, err := c.KubectlOutput("get", "serviceaccount", "default", "-n", "default")
			return err
		})
	}
	return nil
}

func (c Config) apiReady() error {
	admin, err := tls.LoadX509KeyPair(filepath.Join(c.pki(), "admin.crt"), filepath.Join(c.pki(), "admin.key"))
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(filepath.Join(c.pki(), "ca.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return get(&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{admin}, MinVersion: tls.VersionTLS12}, c.Server()+"/readyz")
}

func get(tlsConfig *tls.Config, url string) error {
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// KubectlOutput runs the cluster's kubectl as the administrator.
func (c Config) KubectlOutput(args ...string) (string, error) {
	cmd := exec.Command(c.Kubectl(), append([]string{"--kubeconfig", c.Kubeconfig()}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("kubectl %s: %s", strings.Join(args, " "), strings.TrimSpace(string(ee.Stderr)))
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// certificates makes the cluster's CA, every component's certificate and
// kubeconfig, and the service-account key.
func (c Config) certificates() error {
	dir := c.pki()
	ca, err := pki.NewCA(dir, "egress-proxies cluster CA")
	if err != nil {
		return err
	}
	if _, err := ca.Server(dir, "apiserver", c.NodeIP(), c.APIServiceIP(), "127.0.0.1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"); err != nil {
		return err
	}
	if _, err := ca.Server(dir, "kubelet", c.NodeIP(), c.NodeName); err != nil {
		return err
	}
	if _, err := ca.Client(dir, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", "system:masters"); err != nil {
		return err
	}
	if _, _, err := pki.ServiceAccountKey(dir); err != nil {
		return err
	}
	for _, id := range []struct{ file, user, group string }{
		{"admin", "kubernetes-admin", "system:masters"},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"scheduler", "system:kube-scheduler", ""},
		{"kubelet", "system:node:" + c.NodeName, "system:nodes"},
		{"kube-proxy", "system:kube-proxy", ""},
	} {
		var groups []string
		if id.group != "" {
			groups = []string{id.group}
		}
		pair, err := ca.Client(dir, id.file+"-client", id.user, groups...)
		if err != nil {
			return err
		}
		if id.file == "admin" {
			// The administrator's pair doubles as apiReady's identity.
			if err := os.Rename(pair.Cert, filepath.Join(dir, "admin.crt")); err != nil {
				return err
			}
			if err := os.Rename(pair.Key, filepath.Join(dir, "admin.key")); err != nil {
				return err
			}
		}
		if err := ca.Kubeconfig(filepath.Join(c.State, id.file+".kubeconfig"), c.Server(), pair); err != nil {
			return err
		}
	}
	return nil
}

// Down stops every process of the node and its pods, and undoes what Up
// did to the host: mounts, network namespaces, cgroups, the bridge,
// iptables chains, sysctls, and the paths it made. It is safe to run at
// any point of Up, and again.
func (c Config) Down(step func(string)) error {
	rec, haveRecord := c.readRecord()
	if c.Bins == "" {
		c.Bins = rec.Bins
	}
	step("stop kubelet and kube-proxy")
	c.stop("kubelet", 10*time.Second)
	c.stop("kube-proxy", 5*time.Second)
	step("stop the pods' processes and containerd")
	killCgroups()
	for _, pid := range processesOf(filepath.Join(c.Bins, "containerd-shim-runc-v2")) {
		terminate(pid, 2*time.Second)
	}
	c.stop("containerd", 10*time.Second)
	killCgroups()
	step("stop the control plane")
	for _, name := range []string{"kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"} {
		c.stop(name, 10*time.Second)
	}
	step("remove mounts, network namespaces, cgroups, the bridge and iptables chains")
	netns, _ := filepath.Glob("/run/netns/cni-*")
	unmountUnder(append([]string{c.State, c.Run, "/run/containerd", "/var/lib/kubelet"}, netns...)...)
	for _, ns := range netns {
		_ = os.Remove(ns)
	}
	removeCgroups()
	_ = run("ip", "link", "del", c.Bridge)
	removeChains()
	if haveRecord {
		restoreSysctls(rec)
	}
	step("remove " + c.State + " and " + c.Run)
	var errs []error
	for _, p := range []string{c.State, c.Run} {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range rec.CreatedPaths {
		unmountUnder(p)
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	if left := c.leftovers(rec); len(left) > 0 {
		errs = append(errs, fmt.Errorf("left on the host: %s", strings.Join(left, "; ")))
	}
	return errors.Join(errs...)
}

// leftovers checks, after Down, that nothing of the node is left: its
// processes, mounts, cgroups, bridge, iptables chains and paths gone, and
// every sysctl back at its recorded value.
func (c Config) leftovers(rec hostRecord) []string {
	var left []string
	if c.Bins != "" {
		for _, p := range c.components() {
			if pids := processesOf(filepath.Join(c.Bins, p.args[0]), p.args[1:]...); len(pids) > 0 {
				left = append(left, fmt.Sprintf("%s running (pid %v)", p.name, pids))
			}
		}
		if pids := processesOf(filepath.Join(c.Bins, "containerd-shim-runc-v2")); len(pids) > 0 {
			left = append(left, fmt.Sprintf("containerd shims running (pid %v)", pids))
		}
	}
	if err := run("ip", "link", "show", c.Bridge); err == nil {
		left = append(left, "bridge "+c.Bridge)
	}
	left = append(left, foreignChains()...)
	netns, _ := filepath.Glob("/run/netns/cni-*")
	for _, m := range mountsUnder(append([]string{c.State, c.Run, "/run/containerd", "/var/lib/kubelet"}, netns...)...) {
		left = append(left, "mount "+m)
	}
	walkCgroups(func(dir string) { left = append(left, "cgroup "+dir) })
	for _, p := range append([]string{c.State, c.Run}, rec.CreatedPaths...) {
		if _, err := os.Lstat(p); err == nil {
			left = append(left, "path "+p)
		}
	}
	for k, want := range rec.Sysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil && strings.TrimSpace(string(b)) != want {
			left = append(left, fmt.Sprintf("sysctl %s=%s (was %s)", k, strings.TrimSpace(string(b)), want))
		}
	}
	return left
}

// Apply applies manifests with the administrator's kubectl (server-side,
// so a second apply of the same manifests changes nothing).
func (c Config) Apply(manifests []byte) error {
	cmd := exec.Command(c.Kubectl(), "--kubeconfig", c.Kubeconfig(), "apply", "--server-side", "--force-conflicts", "-f", "-")
	cmd.Stdin = bytes.NewReader(manifests)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl apply: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Rollout waits until the Deployment namespace/name is rolled out.
func (c Config) Rollout(deployment string, timeout time.Duration) error {
	ns, name, _ := strings.Cut(deployment, "/")
	_, err := c.KubectlOutput("rollout", "status", "deployment/"+name, "-n", ns, "--timeout", timeout.String())
	return err
}
