// Package testenv starts a real API server (envtest) with the project's CRDs
// installed, for the tests of every module.
//
// The kube-apiserver and etcd binaries are built from source by
// hack/envtest-bins.sh (the envtest download hosts are unreachable here)
// and cached outside the repository; `make envtest` builds them and
// `make test` exports KUBEBUILDER_ASSETS.
package testenv

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"

	crawlv1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
)

// Env is a running API server.
type Env struct {
	Config *rest.Config
	Client client.Client
	Scheme *k8sruntime.Scheme
	env    *envtest.Environment
}

// NewScheme is kube.NewScheme, here for tests' convenience.
func NewScheme() *k8sruntime.Scheme { return kube.NewScheme() }

// RepoRoot is the repository's top directory, found from this file.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// CRDDir holds the generated CRDs.
func CRDDir() string { return filepath.Join(RepoRoot(), "deploy", "crds") }

// AssetsDir returns the directory of the envtest binaries: KUBEBUILDER_ASSETS
// if set, else the cache hack/envtest-bins.sh fills. It is empty when
// neither has the binaries.
func AssetsDir() string {
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		return d
	}
	cache := os.Getenv("EGRESS_PROXIES_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return ""
		}
		cache = filepath.Join(base, "egress-proxies")
	}
	d := filepath.Join(cache, "envtest", "k8s-1.36.3-etcd-3.6.16")
	if _, err := os.Stat(filepath.Join(d, "kube-apiserver")); err != nil {
		return ""
	}
	return d
}

// Start starts an API server with the CRDs installed. Callers stop it with
// Stop. It fails with a message saying how to get the binaries when they
// are missing.
func Start() (*Env, error) {
	dir := AssetsDir()
	if dir == "" {
		return nil, fmt.Errorf("envtest binaries not found: run `make envtest` (or set KUBEBUILDER_ASSETS)")
	}
	scheme := NewScheme()
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     []string{CRDDir()},
		ErrorIfCRDPathMissing: true,
		Scheme:                scheme,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest from %s: %w", dir, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		_ = env.Stop()
		return nil, err
	}
	return &Env{Config: cfg, Client: c, Scheme: scheme, env: env}, nil
}

// Stop stops the API server and etcd.
func (e *Env) Stop() error { return e.env.Stop() }

// Main is a TestMain body for packages whose tests need an API server: in
// -short mode it runs the tests without one (they skip themselves through
// Require), otherwise it starts one, runs the tests and stops it.
func Main(m *testing.M, env **Env) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		return m.Run()
	}
	e, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping envtest:", err)
	}
	return code
}

// Require skips t in -short mode, where no API server runs.
func Require(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs an API server (envtest); skipped in -short mode")
	}
}

// WriteKubeconfig writes a kubeconfig for the API server to dir and returns
// its path, for processes the tests start.
func (e *Env) WriteKubeconfig(dir string) (string, error) {
	return e.WriteKubeconfigVia(dir, "")
}

// WriteKubeconfigVia is WriteKubeconfig with the server reached at
// hostPort instead (a forwarder the test can cut); "" means directly.
func (e *Env) WriteKubeconfigVia(dir, hostPort string) (string, error) {
	server := e.Config.Host
	if hostPort != "" {
		u, err := url.Parse(e.Config.Host)
		if err != nil {
			return "", err
		}
		u.Host = hostPort
		server = u.String()
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["envtest"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: e.Config.CAData}
	cfg.AuthInfos["envtest"] = &clientcmdapi.AuthInfo{ClientCertificateData: e.Config.CertData, ClientKeyData: e.Config.KeyData, Token: e.Config.BearerToken}
	cfg.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "envtest"}
	cfg.CurrentContext = "envtest"
	path := filepath.Join(dir, "kubeconfig")
	return path, clientcmd.WriteToFile(*cfg, path)
}

var namespaces atomic.Int64

// Namespace creates a namespace named prefix-N, unique in this process.
func (e *Env) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-%d", prefix, namespaces.Add(1))
	if err := e.Client.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
	return name
}

// ReadyProxy creates an External Proxy at ip:port and writes the status
// the controller would give a Ready one (healthy as given), for tests of
// readers of Proxy status (broker, health engine) that run no controller.
func (e *Env) ReadyProxy(t testing.TB, namespace, name, ip string, port int32, attrs map[string]string, healthy bool) *crawlv1alpha1.Proxy {
	t.Helper()
	px, err := e.ReadyProxyE(namespace, name, ip, port, attrs, healthy)
	if err != nil {
		t.Fatal(err)
	}
	return px
}

// ReadyProxyE is ReadyProxy returning its error, for callers that make
// many Proxies from several goroutines.
func (e *Env) ReadyProxyE(namespace, name, ip string, port int32, attrs map[string]string, healthy bool) (*crawlv1alpha1.Proxy, error) {
	ctx := context.Background()
	px := &crawlv1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       crawlv1alpha1.ProxySpec{Mode: crawlv1alpha1.ModeExternal, Address: ip, Port: port, Attributes: attrs},
	}
	if err := e.Client.Create(ctx, px); err != nil {
		return nil, fmt.Errorf("creating Proxy %s/%s: %w", namespace, name, err)
	}
	px.Status = crawlv1alpha1.ProxyStatus{Phase: crawlv1alpha1.PhaseReady, IP: ip, Port: port, Healthy: healthy, InstanceGeneration: 1, HealthInstanceGeneration: 1}
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: crawlv1alpha1.ConditionReady, Status: metav1.ConditionTrue, Reason: crawlv1alpha1.ReasonTracking, Message: "written by the test"})
	h := metav1.Condition{Type: crawlv1alpha1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: crawlv1alpha1.ReasonNotProbed, Message: "written by the test"}
	if healthy {
		h.Status, h.Reason = metav1.ConditionTrue, crawlv1alpha1.ReasonProbeSucceeded
	}
	meta.SetStatusCondition(&px.Status.Conditions, h)
	if err := e.Client.Status().Update(ctx, px); err != nil {
		return nil, fmt.Errorf("writing status of %s/%s: %w", namespace, name, err)
	}
	return px, nil
}

// Manager returns a manager on the shared API server whose cache holds
// namespace only (byObject narrows it further), with metrics and health
// probes off and controller names free to repeat, as reconciler suites
// start one per test.
func (e *Env) Manager(t testing.TB, namespace string, byObject map[client.Object]cache.ByObject) manager.Manager {
	t.Helper()
	controllers := kube.Controllers()
	controllers.SkipNameValidation = ptr.To(true)
	mgr, err := ctrl.NewManager(e.Config, ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             controllers,
		Cache:                  cache.Options{ByObject: byObject, DefaultNamespaces: map[string]cache.Config{namespace: {}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return mgr
}
