package app

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/lifecycle"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/health"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// Options are the controller's flags.
type Options struct {
	Kubeconfig string
	// Uninstall runs the release's pre-delete clean-up instead of the
	// controller (the Helm hook's Job runs the controller's image).
	Uninstall        bool
	UninstallTimeout time.Duration
	// ApplyCRDs is a directory of CRDs to apply instead of running (the
	// chart's pre-install and pre-upgrade hook).
	ApplyCRDs string
	// ApplyTenants is a file of the Tenants a release declares, applied
	// (after the CRDs) in TenantNamespace, labelled for Release.
	ApplyTenants, TenantNamespace, Release string
	// CredentialsKeyFile holds the key Managed proxies' credentials are
	// derived from; credentialsKey is what it held.
	CredentialsKeyFile string
	credentialsKey     proxyauth.Key
	MetricsAddr        string
	HealthAddr         string
	PprofAddr          string
	LeaderElect        bool
	LeaderElectionID   string
	LeaderElectionNS   string
	LeaseDuration      time.Duration
	ProvidersConfig    string
	Namespace          string
	KubeAPIQPS         float64
	KubeAPIBurst       int
	Reconcilers        int
	HealthWriters      int
	StaleIntervals     int
	PollInterval       time.Duration
	ResyncInterval     time.Duration
	ResyncQPS          float64
	BackoffBase        time.Duration
	GCInterval         time.Duration
	GCGrace            time.Duration
	ProbeAddr          string
	ProbeTokenFile     string
	ProbeDenyCIDRs     string
	ProbeTLSCert       string
	ProbeTLSKey        string
	ProbeInsecure      bool
	Health             health.Defaults
	BrokerAddr         string
	BrokerTokenFile    string
	BrokerCAFile       string
	BrokerPoll         time.Duration
	Egress             netpolicy.EgressFlags
	SecretNamespaces   string

	// What Validate parsed.
	deny   netpolicy.DenyList
	egress netpolicy.Egress
	// secretNamespaces is SecretNamespaces split (nil: all).
	secretNamespaces []string
	entries          []providers.Entry
}

// Register adds the flags to fs.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config or $KUBECONFIG")
	fs.StringVar(&o.CredentialsKeyFile, "proxy-credentials-key-file", "", "file holding the key (32 bytes or more) each Managed proxy's credentials are derived from: its instance asks every client for them, the probers and the brokers' leases give them; empty makes Managed instances open proxies")
	fs.BoolVar(&o.Uninstall, "uninstall", false, "instead of running, delete every ProxyPool and Proxy in the cluster and wait until their instances are deleted (the chart's pre-delete hook; the controller must still run)")
	fs.StringVar(&o.ApplyTenants, "apply-tenants", "", "instead of running (after --apply-crds, when given), server-side apply the Tenants in this YAML file in --tenant-namespace, labelled for --release, and delete the release's Tenants it no longer lists")
	fs.StringVar(&o.TenantNamespace, "tenant-namespace", "", "with --apply-tenants: the brokers' namespace")
	fs.StringVar(&o.Release, "release", "", "with --apply-tenants: the Helm release whose Tenants these are")
	fs.StringVar(&o.ApplyCRDs, "apply-crds", "", "instead of running, server-side apply every CustomResourceDefinition in this directory and wait until each is Established (the chart's pre-install and pre-upgrade hook)")
	fs.DurationVar(&o.UninstallTimeout, "uninstall-timeout", 10*time.Minute, "with --uninstall, how long to wait for the Proxies to go before failing with what is left")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address of /metrics")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof profiles; empty means off")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader so only one replica acts")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "egress-proxies-controller", "name of the leader-election Lease")
	fs.StringVar(&o.LeaderElectionNS, "leader-election-namespace", "", "namespace of the leader-election Lease; empty means the pod's own")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a lost leader's lease blocks a new one")
	fs.StringVar(&o.ProvidersConfig, "providers-config", "", "providers config YAML (named provider entries); empty means one entry named kubernetes of type kubernetes")
	fs.StringVar(&o.Namespace, "namespace", "", "the controller's namespace (default pods namespace of the kubernetes provider); empty means the pod's own, else default")
	fs.Float64Var(&o.KubeAPIQPS, "kube-api-qps", DefaultKubeAPIQPS, "steady rate of requests to the API server (client-side); the API server's priority and fairness is the real limit")
	fs.IntVar(&o.KubeAPIBurst, "kube-api-burst", DefaultKubeAPIBurst, "requests to the API server allowed above --kube-api-qps in a burst")
	fs.IntVar(&o.Reconcilers, "max-concurrent-reconciles", lifecycle.DefaultMaxConcurrentReconciles, "Proxies reconciled at once")
	fs.IntVar(&o.HealthWriters, "health-write-workers", health.DefaultWriteWorkers, "health status writes made at once")
	fs.IntVar(&o.StaleIntervals, "health-stale-intervals", health.DefaultStaleIntervals, "intervals a proxy may go without a probe result before its health is stale (Healthy=Unknown, reason ProbeStale, not leasable)")
	fs.DurationVar(&o.PollInterval, "poll-interval", 2*time.Second, "how often a booting or deleting instance is re-read")
	fs.DurationVar(&o.ResyncInterval, "resync-interval", 5*time.Minute, "how often a Ready instance is re-read to notice it vanished (each time jittered by ±25%)")
	fs.Float64Var(&o.ResyncQPS, "resync-qps", lifecycle.DefaultResyncQPS, "re-reads of Ready instances per second and provider entry, at most; past --resync-qps × --resync-interval Ready proxies on one entry each is re-read less often")
	fs.DurationVar(&o.BackoffBase, "backoff-base", 5*time.Second, "first delay of the per-Proxy backoff for quota waits and failing cleanups (doubles up to 5m)")
	fs.DurationVar(&o.GCInterval, "gc-interval", 5*time.Minute, "how often orphan GC sweeps every provider")
	fs.DurationVar(&o.GCGrace, "gc-grace-period", 10*time.Minute, "instances younger than this are never collected")
	fs.StringVar(&o.ProbeAddr, "probe-addr", ":9443", "address of the gRPC probe endpoint probers connect to")
	fs.StringVar(&o.ProbeTokenFile, "probe-token-file", "", "file holding the bearer token probers must send; empty accepts any prober")
	fs.StringVar(&o.ProbeTLSCert, "probe-tls-cert-file", "", "PEM certificate the probe endpoint serves (re-read when it changes, so cert-manager can rotate it)")
	fs.StringVar(&o.ProbeTLSKey, "probe-tls-key-file", "", "PEM key of --probe-tls-cert-file")
	fs.BoolVar(&o.ProbeInsecure, "probe-insecure", false, "serve the probe endpoint in plaintext, without TLS: for local development only")
	fs.StringVar(&o.ProbeDenyCIDRs, "probe-deny-cidrs", netpolicy.DefaultDenyCIDRs, "comma-separated CIDRs a Proxy's address may not be in: such a Proxy is never probed nor leased (Healthy=False, ProbeDenied); private ranges stay allowed, proxies live there (its health-check URL is held to --egress-deny-cidrs)")
	o.Egress.Register(fs)
	fs.StringVar(&o.SecretNamespaces, "secret-namespaces", "", kube.SecretNamespacesFlag)
	fs.StringVar(&o.BrokerAddr, "broker-address", "", "gRPC address of the broker, whose live leases ProxyPools drain before they delete a member; empty means no broker: members hold no leases and drains end at once")
	fs.StringVar(&o.BrokerTokenFile, "broker-token-file", "", "file holding the bearer token the broker asks for; empty, or a file that does not exist, sends none")
	fs.StringVar(&o.BrokerCAFile, "broker-ca-file", "", "PEM CA bundle the broker's certificate is verified with; set, the controller reads leases over TLS (a broker serving TLS refuses plaintext); empty means plaintext")
	fs.DurationVar(&o.BrokerPoll, "broker-poll-interval", 5*time.Second, "how often live leases are read from the broker")
	d := health.DefaultDefaults
	fs.StringVar(&o.Health.URL, "health-url", d.URL, "URL probed through every proxy (per-Proxy: spec.healthCheck.url)")
	fs.IntVar(&o.Health.ExpectedStatus, "health-expected-status", d.ExpectedStatus, "HTTP status the probe target must answer")
	fs.DurationVar(&o.Health.Interval, "health-interval", d.Interval, "time between probes of one proxy")
	fs.DurationVar(&o.Health.Timeout, "health-timeout", d.Timeout, "bound of one probe")
	fs.IntVar(&o.Health.FailureThreshold, "health-failure-threshold", d.FailureThreshold, "consecutive failures that make a proxy Unhealthy")
	fs.IntVar(&o.Health.SuccessThreshold, "health-success-threshold", d.SuccessThreshold, "consecutive successes that make it Healthy")
	fs.StringVar(&o.Health.EchoFormat, "health-echo-format", "", `how the target echoes the caller's IP: "" (it does not), "text", or "json:<field>"; fills status.egressIP`)
	fs.BoolVar(&o.Health.Trace, "trace-health-probes", false, "trace every probe end to end (high volume)")
}

// The API client's defaults. client-go's own (5/s, burst 10) took a
// thousand Proxies minutes to bring up. A Proxy costs the controller two
// writes on its way to Ready and Healthy (the lifecycle's status, the
// first health verdict); an API server takes custom-resource writes far
// slower than 1,000 a second on small machines (300 to 600 on the 2 cores
// bench-fleet runs on), so the client-side limit never binds in a
// bring-up. It is a fuse against a hot loop; API priority and fairness on
// the server decides what this controller really gets.
const (
	DefaultKubeAPIQPS   = 1000
	DefaultKubeAPIBurst = 2000
)

// Validate names the first bad flag and parses the deny list and the
// providers config.
func (o *Options) Validate() error {
	if o.ApplyCRDs != "" || o.ApplyTenants != "" {
		switch {
		case o.Uninstall:
			return errors.New("--apply-crds and --apply-tenants contradict --uninstall: choose one")
		case o.ApplyTenants != "" && (o.TenantNamespace == "" || o.Release == ""):
			return errors.New("--apply-tenants needs --tenant-namespace and --release")
		}
		return nil // nothing else runs
	}
	if o.Uninstall {
		if o.UninstallTimeout <= 0 {
			return errors.New("--uninstall-timeout must be positive")
		}
		return nil // nothing else runs
	}
	switch {
	case o.LeaseDuration < 3*time.Second:
		return errors.New("--leader-election-lease-duration must be at least 3s")
	case o.PollInterval <= 0 || o.ResyncInterval <= 0 || o.GCInterval <= 0 || o.GCGrace < 0 || o.BackoffBase <= 0:
		return errors.New("--poll-interval, --resync-interval, --backoff-base and --gc-interval must be positive and --gc-grace-period not negative")
	case o.KubeAPIQPS <= 0 || o.KubeAPIBurst < 1:
		return fmt.Errorf("--kube-api-qps must be positive and --kube-api-burst at least 1 (got %g and %d)", o.KubeAPIQPS, o.KubeAPIBurst)
	case o.Reconcilers < 1 || o.HealthWriters < 1:
		return fmt.Errorf("--max-concurrent-reconciles and --health-write-workers must be at least 1 (got %d and %d)", o.Reconcilers, o.HealthWriters)
	case o.StaleIntervals < 2:
		return fmt.Errorf("--health-stale-intervals must be at least 2 (got %d): one late probe is not a stopped fleet", o.StaleIntervals)
	case o.ResyncQPS <= 0:
		return fmt.Errorf("--resync-qps must be positive (got %g)", o.ResyncQPS)
	case o.BrokerPoll <= 0:
		return fmt.Errorf("--broker-poll-interval must be positive (got %s)", o.BrokerPoll)
	}
	if err := o.Health.Validate(); err != nil {
		return err
	}
	switch {
	case o.ProbeInsecure && (o.ProbeTLSCert != "" || o.ProbeTLSKey != ""):
		return errors.New("--probe-insecure contradicts --probe-tls-cert-file and --probe-tls-key-file: choose one")
	case !o.ProbeInsecure && (o.ProbeTLSCert == "" || o.ProbeTLSKey == ""):
		return errors.New("--probe-tls-cert-file and --probe-tls-key-file are required: the probe stream decides which proxies are leased (--probe-insecure serves plaintext, for local development only)")
	}
	var err error
	if o.deny, err = netpolicy.Parse(o.ProbeDenyCIDRs); err != nil {
		return fmt.Errorf("--probe-deny-cidrs: %w", err)
	}
	if o.egress, err = o.Egress.Parse(); err != nil {
		return err
	}
	if o.secretNamespaces, err = kube.ParseNamespaces(o.SecretNamespaces); err != nil {
		return fmt.Errorf("--secret-namespaces: %w", err)
	}
	if o.entries, err = loadEntries(o.ProvidersConfig); err != nil {
		return fmt.Errorf("--providers-config: %w", err)
	}
	if o.credentialsKey, err = proxyauth.LoadKey(o.CredentialsKeyFile); err != nil {
		return fmt.Errorf("--proxy-credentials-key-file: %w", err)
	}
	return nil
}
