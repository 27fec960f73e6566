package cluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/credentials"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/test/framework"
)

type harness struct {
	t          *testing.T
	kubeconfig string
	kubectl    string
	repo       string
	dir        string
	c          client.Client
	// targetTLS is the crawl target's certificate, key and CA.
	targetTLS map[string][]byte
	start     time.Time
}

// logf prints progress inside a step, with the time since the test
// started, as it happens (a step can take minutes).
func (h *harness) logf(format string, args ...any) {
	fmt.Printf("e2e-cluster:   %6.1fs %s\n", time.Since(h.start).Seconds(), fmt.Sprintf(format, args...))
}

func newHarness(t *testing.T) *harness {
	kubeconfig, kubectl := framework.Cluster(t)
	cfg, err := kube.RestConfig(kubeconfig)
	require.NoError(t, err)
	c, err := client.New(cfg, client.Options{Scheme: kube.NewScheme()})
	require.NoError(t, err)
	return &harness{t: t, kubeconfig: kubeconfig, kubectl: kubectl, repo: testenv.RepoRoot(), dir: t.TempDir(), c: c, start: time.Now()}
}

// run runs a command and returns its output, or an error holding both
// streams.
func run(ctx context.Context, dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w\n%s%s", filepath.Base(name), strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return strings.TrimSpace(stdout.String()), nil
}

func (h *harness) kubectlOut(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return run(ctx, h.repo, nil, h.kubectl, append([]string{"--kubeconfig", h.kubeconfig}, args...)...)
}

func (h *harness) mustKubectl(args ...string) string {
	h.t.Helper()
	out, err := h.kubectlOut(args...)
	require.NoError(h.t, err)
	return out
}

// helm runs the helm pinned in hack/tools/go.mod against the cluster.
func (h *harness) helm(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	return run(ctx, h.repo, []string{"GOWORK=" + filepath.Join(h.repo, "hack", "tools", "go.work"), "KUBECONFIG=" + h.kubeconfig},
		"go", append([]string{"tool", "helm"}, args...)...)
}

// applyYAML applies manifests with kubectl.
func (h *harness) applyYAML(manifest string) {
	h.t.Helper()
	f := filepath.Join(h.dir, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
	require.NoError(h.t, os.WriteFile(f, []byte(manifest), 0o644))
	h.mustKubectl("apply", "--server-side", "-f", f)
}

// eventually polls fn until it returns nil; on timeout the test fails
// with fn's last error.
func (h *harness) eventually(timeout time.Duration, what string, fn func() error) {
	h.t.Helper()
	require.NoError(h.t, wait(timeout, what, fn))
}

func wait(timeout time.Duration, what string, fn func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		if last = fn(); last == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %s, %s: %w", timeout, what, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (h *harness) namespace(name string) {
	h.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := h.c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		require.NoError(h.t, err)
	}
}

// secret creates or replaces a Secret.
func (h *harness) secret(ns, name string, typ corev1.SecretType, data map[string][]byte) {
	h.t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Type: typ, Data: data}
	ctx := context.Background()
	_ = h.c.Delete(ctx, s)
	h.eventually(30*time.Second, "secret "+ns+"/"+name+" re-created", func() error { return h.c.Create(ctx, s.DeepCopy()) })
}

func (h *harness) secretData(ns, name, key string) []byte {
	h.t.Helper()
	var s corev1.Secret
	require.NoError(h.t, h.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s))
	return s.Data[key]
}

// serverTLS issues a certificate for hosts from a CA of its own and
// returns the kubernetes.io/tls Secret data (tls.crt, tls.key, ca.crt).
func serverTLS(t *testing.T, hosts ...string) map[string][]byte {
	ca, err := certs.NewCA("egress-proxies e2e CA")
	require.NoError(t, err)
	dir := t.TempDir()
	files, err := ca.WriteServer(dir, hosts...)
	require.NoError(t, err)
	out := map[string][]byte{}
	for key, path := range map[string]string{"tls.crt": files.Cert, "tls.key": files.Key, "ca.crt": files.CA} {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		out[key] = b
	}
	return out
}

// serviceNames are the DNS names of a Service as pods use them.
func serviceNames(svc, ns string) []string {
	return []string{svc, svc + "." + ns, svc + "." + ns + ".svc", svc + "." + ns + ".svc.cluster.local"}
}

// clusterIP is a Service's address, which this host reaches through
// kube-proxy's rules as pods do.
func (h *harness) clusterIP(ns, name string) string {
	h.t.Helper()
	var svc corev1.Service
	require.NoError(h.t, h.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &svc))
	return svc.Spec.ClusterIP
}

// leaser is a Go crawler on this host, dialing the broker's gRPC Service.
func (h *harness) leaser(in *install) *leaseclient.Client {
	h.t.Helper()
	token := strings.TrimSpace(string(h.secretData(in.ns, in.release+"-discovery-token", "token")))
	opts := []leaseclient.Option{leaseclient.WithToken(token)}
	if in.brokerCA != nil {
		pool := x509.NewCertPool()
		require.True(h.t, pool.AppendCertsFromPEM(in.brokerCA))
		opts = append(opts, leaseclient.WithTLS(credentials.NewTLS(&tls.Config{
			RootCAs: pool, ServerName: in.release + "-broker-grpc." + in.ns + ".svc", MinVersion: tls.VersionTLS12,
		})))
	}
	c, err := leaseclient.Dial(net.JoinHostPort(h.clusterIP(in.ns, in.release+"-broker-grpc"), "9090"), opts...)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { _ = c.Close() })
	return c
}

// podsOf lists the pods matching a label selector.
func (h *harness) podsOf(ns, selector string) []corev1.Pod {
	h.t.Helper()
	var pods corev1.PodList
	sel, err := metav1.ParseToLabelSelector(selector)
	require.NoError(h.t, err)
	ls, err := metav1.LabelSelectorAsSelector(sel)
	require.NoError(h.t, err)
	require.NoError(h.t, h.c.List(context.Background(), &pods, client.InNamespace(ns), client.MatchingLabelsSelector{Selector: ls}))
	return pods.Items
}

var lastProbe = regexp.MustCompile(`^proxy_operator_healthcheck_last_timestamp_seconds\{(.*)\}$`)
var nameLabel = regexp.MustCompile(`(?:^|,)name="([^"]*)"`)

// lastProbes reads, from every controller replica's metrics, when each
// proxy was last probed (the leader's series; a follower has none).
func (h *harness) lastProbes(in *install) (map[string]float64, error) {
	out := map[string]float64{}
	var errs []error
	for _, p := range h.podsOf(in.ns, "app.kubernetes.io/component=controller") {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil {
			continue
		}
		samples, err := podMetrics(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for series, v := range samples {
			m := lastProbe.FindStringSubmatch(series)
			if m == nil {
				continue
			}
			if n := nameLabel.FindStringSubmatch(m[1]); n != nil && v > out[n[1]] {
				out[n[1]] = v
			}
		}
	}
	if len(out) == 0 && len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// leaderMetrics scrapes the leading controller's metrics.
func (h *harness) leaderMetrics(in *install) (promtext.Samples, error) {
	leader := h.leader(in)
	for _, p := range h.podsOf(in.ns, "app.kubernetes.io/component=controller") {
		if p.Name == leader && p.Status.PodIP != "" {
			return podMetrics(p)
		}
	}
	return nil, fmt.Errorf("leader %q has no address", leader)
}

// podMetrics scrapes a controller pod's metrics port, which this host
// reaches on the pod's address.
func podMetrics(p corev1.Pod) (promtext.Samples, error) {
	return promtext.Scrape(&http.Client{Timeout: 2 * time.Second}, "http://"+net.JoinHostPort(p.Status.PodIP, "8080")+"/metrics")
}

// leader is the pod holding the controller's leader-election Lease.
func (h *harness) leader(in *install) string {
	out, err := h.kubectlOut("get", "lease", in.release+"-controller", "-n", in.ns, "-o", "jsonpath={.spec.holderIdentity}")
	if err != nil {
		return ""
	}
	pod, _, _ := strings.Cut(out, "_")
	return pod
}
