// Package system starts the whole of egress-proxies on loopback: a real API
// server and etcd, Redis with AOF, the controller, probers and brokers as
// real processes, an HTTPS probe target with its own CA, and a kubelet
// stand-in running a real Squid per kubernetes-provider pod. The demo and
// the end-to-end tests run on it.
package system

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/kubelet"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/tlstarget"
)

// Options size the system.
type Options struct {
	Probers, Brokers int
	// Controllers is how many controller replicas run, electing a leader;
	// 0 means 1. Probers reach them through one balancer, as through the
	// chart's Service.
	Controllers int
	// HealthInterval between probes of one proxy.
	HealthInterval time.Duration
	// HealthTimeout bounds one probe; 0 means three quarters of the
	// interval, at most 2s (it must be below the interval).
	HealthTimeout time.Duration
	// ControllerArgs are appended to the controller's flags (a later flag
	// wins), to try other settings.
	ControllerArgs []string
	// BrokerArgs are appended to broker i's flags, likewise.
	BrokerArgs map[int][]string
	// GCInterval and GCGrace of orphan GC.
	GCInterval, GCGrace time.Duration
	// CuttableAPIServer routes every service to the API server through a
	// proc.Cutter (System.APILink), so a test can partition them from it.
	CuttableAPIServer bool
	// BrokerToken, when set, is the bearer token the brokers require
	// (and the controllers send): then leases carry proxy credentials.
	BrokerToken string
	// BrokerTLS makes broker 0 serve TLS (its CA in System.BrokerCA), as
	// the chart's broker.tls does, and the controllers read leases from
	// it over TLS; any other brokers stay plaintext.
	BrokerTLS bool
	// Gateway, with BrokerToken, has every broker serve the proxy gateway
	// (Broker.Gateway), letting loopback targets through as the suites'
	// Squids do.
	Gateway bool
	// GatewayToken, when set, is a gateway-only password the brokers
	// accept (--gateway-token-file), as the chart's auth.gatewayToken.
	GatewayToken string
	// ProxyCredentials gives the controllers and brokers a credentials
	// key: Managed proxies then ask every client for their own.
	ProxyCredentials bool
	// Step, when set, hears progress.
	Step func(format string, args ...any)
}

// PodNamespace is where the kubernetes provider runs its pods.
const PodNamespace = "egress-proxies"

// System is everything running.
type System struct {
	T          proc.T
	Env        *testenv.Env
	Client     client.Client
	Kubeconfig string
	Redis      *proc.Redis
	Target     *tlstarget.Target
	Bins       map[string]string
	// Controllers are the controller replicas, by index.
	Controllers []*Controller
	// ProbeBalancer is the one address probers dial: a per-connection
	// round-robin balancer over every replica's probe endpoint, as the
	// chart's ClusterIP Service is.
	ProbeBalancer *proc.Cutter
	Probers       []*proc.Process
	// ProberOps are the probers' ops addresses (/metrics), by index.
	ProberOps []string
	Brokers   []*Broker
	Kubelet   *kubelet.StandIn
	// APILink is the link between the services and the API server, when
	// Options.CuttableAPIServer is set.
	APILink *proc.Cutter
	// BrokerCA is the PEM CA broker 0's certificate chains to, with
	// Options.BrokerTLS.
	BrokerCA string
	token    string
	probeTLS certs.Files
	opts     Options
}

// Controller is one controller replica and its addresses.
type Controller struct {
	Proc    *proc.Process
	Metrics string // host:port of /metrics
	// Pprof serves the controller's /debug/pprof.
	Pprof string
	// Probe is the replica's own probe endpoint.
	Probe string
	args  []string
}

// Broker is one broker process and its addresses.
type Broker struct {
	Proc *proc.Process
	REST string // http://host:port
	GRPC string
	Ops  string
	// Pprof serves the broker's /debug/pprof.
	Pprof string
	// Gateway is the proxy gateway's host:port (Options.Gateway); it stays
	// across restarts, as GRPC does.
	Gateway string
	args    []string
}

// Start brings the system up; everything stops when t's cleanups run.
func Start(t proc.T, env *testenv.Env, o Options) *System {
	t.Helper()
	if o.Step == nil {
		o.Step = func(string, ...any) {}
	}
	if o.HealthInterval == 0 {
		o.HealthInterval = 2 * time.Second
	}
	if o.HealthTimeout == 0 {
		o.HealthTimeout = min(2*time.Second, o.HealthInterval*3/4)
	}
	if o.GCInterval == 0 {
		o.GCInterval, o.GCGrace = 30*time.Second, time.Minute
	}
	s := &System{T: t, Env: env, Client: env.Client, Bins: map[string]string{}, opts: o}
	dir := t.TempDir()
	ctx := context.Background()
	var err error
	via := ""
	if o.CuttableAPIServer {
		u, err := url.Parse(env.Config.Host)
		if err != nil {
			t.Fatal(err)
		}
		s.APILink = proc.NewCutter(t, u.Host)
		via = s.APILink.Addr
	}
	if s.Kubeconfig, err = env.WriteKubeconfigVia(dir, via); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"egress-proxies-system", PodNamespace} {
		_ = s.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	}

	o.Step("starting Redis (appendonly), the HTTPS probe target, and building the three services")
	s.Redis = proc.StartRedis(t, true)
	if s.Target, err = tlstarget.Start("127.0.0.1:0", dir); err != nil {
		t.Fatalf("probe target: %v", err)
	}
	t.Cleanup(func() { _ = s.Target.Close() })
	for _, name := range []string{"controller", "prober", "broker"} {
		s.Bins[name] = proc.Build(t, "github.com/egress-proxies/egress-proxies/services/"+name+"/cmd/"+name)
	}
	s.token = filepath.Join(dir, "probe-token")
	providers := filepath.Join(dir, "providers.yaml")
	if err := os.WriteFile(s.token, []byte("probe-token-of-this-system\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(providers, []byte("providers:\n  - name: kubernetes\n    type: kubernetes\n    kubernetes:\n      namespace: "+PodNamespace+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	if o.Controllers == 0 {
		o.Controllers = 1
	}
	// The probe stream runs over TLS, as in a cluster: one CA, one
	// certificate every replica serves; with BrokerTLS the same CA signs
	// broker 0's.
	ca, err := certs.NewCA("egress-proxies system CA")
	if err != nil {
		t.Fatal(err)
	}
	if s.probeTLS, err = ca.WriteServer(dir, "127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	// Flags the brokers get, and the same files as the controllers name them.
	var brokerAuth, controllerAuth []string
	if o.BrokerToken != "" {
		tokenFile := filepath.Join(dir, "broker-token")
		if err := os.WriteFile(tokenFile, []byte(o.BrokerToken), 0o600); err != nil {
			t.Fatal(err)
		}
		brokerAuth = []string{"--token-file", tokenFile}
		controllerAuth = []string{"--broker-token-file", tokenFile}
	}
	if o.GatewayToken != "" {
		gwFile := filepath.Join(dir, "gateway-token")
		if err := os.WriteFile(gwFile, []byte(o.GatewayToken), 0o600); err != nil {
			t.Fatal(err)
		}
		brokerAuth = append(brokerAuth, "--gateway-token-file", gwFile)
	}
	if o.ProxyCredentials {
		keyFile := filepath.Join(dir, "proxy-credentials-key")
		if err := os.WriteFile(keyFile, []byte("a key of this system, 32 bytes or more\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		keyArgs := []string{"--proxy-credentials-key-file", keyFile}
		brokerAuth, controllerAuth = append(brokerAuth, keyArgs...), append(controllerAuth, keyArgs...)
	}
	// Brokers keep their gRPC address across restarts, behind one
	// balancer the controllers read live leases through, as through the
	// chart's Service.
	grpcs := make([]string, o.Brokers)
	if o.Gateway && o.BrokerToken == "" {
		t.Fatal("system: Options.Gateway needs BrokerToken (the gateway's password)")
	}
	for i := range o.Brokers {
		grpcs[i] = proc.Addr(proc.FreePort(t))
		b := &Broker{GRPC: grpcs[i], Pprof: proc.Addr(proc.FreePort(t))}
		b.args = append([]string{"--kubeconfig", s.Kubeconfig, "--redis-addrs", s.Redis.Addr, "--pprof-bind-address", b.Pprof}, brokerAuth...)
		if o.Gateway {
			b.Gateway = proc.Addr(proc.FreePort(t))
			b.args = append(b.args, "--gateway-addr", b.Gateway, "--egress-allowance-cidrs", proc.SuiteAllowance)
		}
		b.args = append(b.args, o.BrokerArgs[i]...)
		s.Brokers = append(s.Brokers, b)
	}
	var brokerArgs []string
	switch {
	case o.Brokers > 0 && o.BrokerTLS:
		tlsFiles, err := ca.WriteServer(t.TempDir(), "127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		s.BrokerCA = tlsFiles.CA
		s.Brokers[0].args = append(s.Brokers[0].args, "--tls-cert-file", tlsFiles.Cert, "--tls-key-file", tlsFiles.Key)
		brokerArgs = []string{"--broker-address", grpcs[0], "--broker-ca-file", tlsFiles.CA, "--broker-poll-interval", "500ms"}
	case o.Brokers > 0:
		brokerArgs = []string{"--broker-address", proc.NewBalancer(t, grpcs...).Addr, "--broker-poll-interval", "500ms"}
	}
	brokerArgs = append(brokerArgs, controllerAuth...)
	o.Step("starting %d controller replica(s) (leader election, probe endpoint, health checks through every proxy, ProxyPools)", o.Controllers)
	for range o.Controllers {
		c := &Controller{Metrics: proc.Addr(proc.FreePort(t)), Pprof: proc.Addr(proc.FreePort(t)), Probe: proc.Addr(proc.FreePort(t))}
		c.args = append([]string{
			"--kubeconfig", s.Kubeconfig, "--namespace", "egress-proxies-system", "--providers-config", providers,
			"--metrics-bind-address", c.Metrics, "--health-probe-bind-address", proc.Addr(proc.FreePort(t)),
			"--pprof-bind-address", c.Pprof,
			"--leader-election-lease-duration", "4s", "--poll-interval", "200ms",
			"--probe-addr", c.Probe, "--probe-token-file", s.token,
			"--probe-tls-cert-file", s.probeTLS.Cert, "--probe-tls-key-file", s.probeTLS.Key,
			"--health-url", s.Target.URL + "/ip", "--health-expected-status", "200", "--health-echo-format", "text",
			"--egress-allowance-cidrs", proc.SuiteAllowance,
			"--health-interval", o.HealthInterval.String(), "--health-timeout", o.HealthTimeout.String(),
			"--gc-interval", o.GCInterval.String(), "--gc-grace-period", o.GCGrace.String(),
		}, append(brokerArgs, o.ControllerArgs...)...)
		s.Controllers = append(s.Controllers, c)
		s.StartController(len(s.Controllers) - 1)
	}
	probes := make([]string, len(s.Controllers))
	for i, c := range s.Controllers {
		probes[i] = c.Probe
	}
	s.ProbeBalancer = proc.NewBalancer(t, probes...)

	o.Step("starting %d probers", o.Probers)
	for i := range o.Probers {
		s.Probers = append(s.Probers, nil)
		s.ProberOps = append(s.ProberOps, proc.Addr(proc.FreePort(t)))
		s.StartProber(i)
	}

	o.Step("starting %d brokers sharing Redis", o.Brokers)
	for i := range o.Brokers {
		s.StartBroker(i)
	}

	o.Step("starting the kubelet stand-in (a real Squid per kubernetes-provider pod, on its own 127.x.y.z)")
	s.Kubelet = &kubelet.StandIn{Client: s.Client, Namespace: PodNamespace, T: t, Log: func(f string, a ...any) { o.Step(f, a...) }}
	kctx, kcancel := context.WithCancel(ctx)
	kdone := make(chan struct{})
	go func() { s.Kubelet.Run(kctx, 200*time.Millisecond); close(kdone) }()
	t.Cleanup(func() { kcancel(); <-kdone })
	return s
}

// StartController starts (or restarts) controller replica i with its
// arguments.
func (s *System) StartController(i int) {
	s.T.Helper()
	c := s.Controllers[i]
	c.Proc = proc.Start(s.T, fmt.Sprintf("controller-%d", i), s.Bins["controller"], c.args...)
	proc.WaitHTTP(s.T, c.Proc, "http://"+c.Metrics+"/metrics", 60*time.Second)
}

// StartProber starts (or restarts) prober i under its id and ops address.
func (s *System) StartProber(i int) {
	s.T.Helper()
	ops := s.ProberOps[i]
	p := proc.Start(s.T, fmt.Sprintf("prober-%d", i), s.Bins["prober"], "--controller-addr", s.ProbeBalancer.Addr, "--controller-ca-file", s.probeTLS.CA, "--token-file", s.token,
		"--id", fmt.Sprintf("prober-%d", i), "--ca-file", s.Target.CAFile, "--ops-addr", ops, "--egress-allowance-cidrs", proc.SuiteAllowance)
	proc.WaitHTTP(s.T, p, "http://"+ops+"/healthz", 30*time.Second)
	s.Probers[i] = p
}

// Leader is the index of the replica that leads now, by its own word (its
// leader_election_master_status gauge), or -1 while none does.
func (s *System) Leader() int {
	for i, c := range s.Controllers {
		if c.Proc == nil || c.Proc.Exited() {
			continue
		}
		m, err := promtext.Scrape(nil, "http://"+c.Metrics+"/metrics")
		if err == nil && m.Sum("leader_election_master_status") == 1 {
			return i
		}
	}
	return -1
}

// StartBroker starts (or restarts) broker i: its gRPC address stays, the
// others are fresh.
func (s *System) StartBroker(i int) {
	s.T.Helper()
	b := s.Brokers[i]
	ops, g, h := proc.Addr(proc.FreePort(s.T)), b.GRPC, proc.Addr(proc.FreePort(s.T))
	b.Proc = proc.Start(s.T, fmt.Sprintf("broker-%d", i), s.Bins["broker"], append([]string{"--ops-addr", ops, "--grpc-addr", g, "--http-addr", h}, b.args...)...)
	proc.WaitHTTP(s.T, b.Proc, "http://"+ops+"/readyz", 60*time.Second)
	scheme := "http://"
	if i == 0 && s.BrokerCA != "" {
		scheme = "https://"
	}
	b.REST, b.GRPC, b.Ops = scheme+h, g, "http://"+ops
}
