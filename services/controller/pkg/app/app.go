// Package app wires the controller: the Kubernetes client and caches,
// leader election, the Proxy and ProxyPool controllers, orphan GC, and the probe
// endpoint the prober fleet connects to. Every service has an app package
// of this shape: Options (flags and their checks) and Run, a few named
// steps.
package app

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/pkg/version"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/garbagecollection"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/lifecycle"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxypool"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxypool/autoscaler"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxysource"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/crds"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/health"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/tenanthook"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/uninstall"
)

// Name is the controller's name in logs, flags' environment variables,
// Events and the leader-election Lease.
const Name = "controller"

// Run runs the controller until ctx ends.
func Run(ctx context.Context, env service.Env, o Options) error {
	log := env.Log
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	if o.ApplyCRDs != "" || o.ApplyTenants != "" {
		return runApplyHook(ctx, log, o)
	}
	if o.Uninstall {
		return runUninstall(ctx, log, o)
	}
	probeTLS, probeToken, err := probeCredentials(ctx, log, o)
	if err != nil {
		return err
	}
	namespace := podNamespace(log, o.Namespace)
	mgr, err := newManager(o, namespace)
	if err != nil {
		return err
	}
	registry, err := providers.NewRegistry(ctx, o.entries, factories, providers.Deps{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Namespace: namespace, Egress: o.egress, Log: log,
	})
	if err != nil {
		return service.Usagef("--providers-config: %v", err)
	}
	if err := addProxyControllers(ctx, mgr, registry, log, o); err != nil {
		return err
	}
	engine, err := addProbeHub(ctx, mgr, log, o, probeTLS, probeToken)
	if err != nil {
		return err
	}
	leases, err := addPoolController(ctx, mgr, log, o, engine.Confirm)
	if err != nil {
		return err
	}
	if err := addSourceController(mgr, log, o, leases, engine); err != nil {
		return err
	}
	if o.credentialsKey == nil {
		log.Warn("NO PROXY CREDENTIALS KEY: Managed instances are made as OPEN proxies, which anyone who reaches them may use; set --proxy-credentials-key-file")
	}
	log.Info("starting", "providers", registry.Names(), "namespace", namespace, "commit", version.Commit,
		"probeAuth", probeToken.Enabled(), "probeTLS", probeTLS != nil)
	return mgr.Start(ctx)
}

// probeCredentials loads the probe endpoint's certificate (re-read when
// it changes) and the token probers must send; nil for each that is off.
func probeCredentials(ctx context.Context, log *slog.Logger, o Options) (*tls.Config, *auth.Token, error) {
	var probeTLS *tls.Config
	if o.ProbeInsecure {
		log.Warn("--probe-insecure: the probe endpoint serves plaintext")
	} else {
		cert, err := certs.NewReloading(ctx, log, o.ProbeTLSCert, o.ProbeTLSKey)
		if err != nil {
			return nil, nil, service.Usagef("--probe-tls-cert-file, --probe-tls-key-file: %v", err)
		}
		probeTLS = cert.ServerConfig()
	}
	probeToken, err := auth.FromFlag(ctx, log, "--probe-token-file", o.ProbeTokenFile)
	if err != nil {
		return nil, nil, service.UsageError{Err: err}
	}
	if !probeToken.Enabled() {
		log.Warn("no --probe-token-file: the probe endpoint accepts any prober")
	}
	return probeTLS, probeToken, nil
}

// registerMetrics registers every package's metrics with the manager's
// registry, once a process: each package declares its own (Collectors),
// and this is the one place they are registered, as the broker's and the
// prober's are in theirs.
var registerMetrics sync.Once

// newManager makes the manager: API client limits, caches, leader
// election, metrics and health endpoints.
func newManager(o Options, namespace string) (ctrl.Manager, error) {
	cfg, err := kube.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, service.Usagef("--kubeconfig: %v", err)
	}
	cfg.QPS, cfg.Burst = float32(o.KubeAPIQPS), o.KubeAPIBurst
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  kube.NewScheme(),
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:  o.HealthAddr,
		PprofBindAddress:        o.PprofAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: cmp.Or(o.LeaderElectionNS, namespace),
		Cache:                   cache.Options{ByObject: lifecycle.CacheByObject(o.secretNamespaces)},
		Controller:              kube.Controllers(),
		LeaseDuration:           &o.LeaseDuration,
		// client-go's ratios (15s/10s/2s), derived so one flag is enough.
		RenewDeadline: ptr.To(o.LeaseDuration * 2 / 3),
		RetryPeriod:   ptr.To(o.LeaseDuration * 2 / 15),
		// A replica that loses its lease exits rather than keep acting
		// on a stale view; Kubernetes restarts it as a follower.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return nil, fmt.Errorf("creating manager: %w", err)
	}
	registerMetrics.Do(func() {
		ctrlmetrics.Registry.MustRegister(slices.Concat(health.Collectors(), proxypool.Collectors(), garbagecollection.Collectors(),
			lifecycle.Collectors(), providers.Collectors(), leaseview.Collectors(), metrics.Collectors())...)
	})
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// addProxyControllers adds the Proxy reconciler and orphan GC.
func addProxyControllers(ctx context.Context, mgr ctrl.Manager, registry *providers.Registry, log *slog.Logger, o Options) error {
	rec := lifecycle.New(mgr.GetClient(), registry, mgr.GetEventRecorder(EventSource), log.With("controller", "lifecycle"), lifecycle.Options{
		PollInterval: o.PollInterval, ResyncInterval: o.ResyncInterval, ResyncQPS: o.ResyncQPS, BackoffBase: o.BackoffBase,
		MaxConcurrentReconciles: o.Reconcilers, CredentialsKey: o.credentialsKey, SecretNamespaces: o.secretNamespaces,
	})
	if err := rec.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the Proxy controller: %w", err)
	}
	if err := ctrlmetrics.Registry.Register(metrics.FleetCollector(mgr.GetCache(), mgr.Elected())); err != nil {
		return fmt.Errorf("registering the fleet gauges: %w", err)
	}
	return mgr.Add(garbagecollection.New(registry, mgr.GetAPIReader(), log.With("controller", "gc"),
		garbagecollection.Options{Interval: o.GCInterval, Grace: o.GCGrace}))
}

// runUninstall is the pre-delete hook: it empties the cluster of Pools and
// Proxies while the controller still runs to delete their instances.
func runUninstall(ctx context.Context, log *slog.Logger, o Options) error {
	c, err := hookClient(o)
	if err != nil {
		return err
	}
	return (&uninstall.Cleaner{Client: c, Log: log, Timeout: o.UninstallTimeout, Poll: 2 * time.Second}).Run(ctx)
}

// runApplyHook is the pre-install and pre-upgrade hook: it applies the
// chart's CRDs, which then belong to no release (package crds says why),
// then the Tenants the release declares (package tenants says why here).
func runApplyHook(ctx context.Context, log *slog.Logger, o Options) error {
	var defs []*unstructured.Unstructured
	var declared []v1.Tenant
	var err error
	if o.ApplyCRDs != "" {
		if defs, err = crds.Load(o.ApplyCRDs); err != nil {
			return service.Usagef("%v", err)
		}
	}
	if o.ApplyTenants != "" {
		if declared, err = tenanthook.Load(o.ApplyTenants); err != nil {
			return service.Usagef("--apply-tenants: %v", err)
		}
	}
	c, err := hookClient(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := crds.Apply(ctx, c, log, defs); err != nil {
		return err
	}
	if o.ApplyTenants == "" {
		return nil
	}
	return tenanthook.Sync(ctx, c, log, o.TenantNamespace, o.Release, declared)
}

// hookClient is the API client of the chart's hooks, which run the
// controller's image for one task.
func hookClient(o Options) (client.Client, error) {
	cfg, err := kube.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, service.Usagef("--kubeconfig: %v", err)
	}
	return client.New(cfg, client.Options{Scheme: kube.NewScheme()})
}

// addPoolController adds the ProxyPool rollout and autoscaler and, with a
// broker configured, the poller that tells them the members' live leases
// (and tells quarantined, the health engine's Confirm, which proxies the
// brokers quarantined). It returns the live-lease view it made.
func addPoolController(ctx context.Context, mgr ctrl.Manager, log *slog.Logger, o Options, quarantined func(map[string]time.Time)) (leaseview.Source, error) {
	log = log.With("controller", "proxypool")
	wakeups, scaling := proxypool.NewWakeups(mgr.GetClient()), leaseview.NewWake()
	var leases leaseview.Source = leaseview.None{}
	var poller *leaseview.Poller
	if o.BrokerAddr != "" {
		broker, err := dialBroker(ctx, log, o)
		if err != nil {
			return nil, err
		}
		polled := func() { wakeups.Polled(); scaling.Polled() }
		poller = leaseview.NewPoller(broker.API(), log, leaseview.PollerOptions{Interval: o.BrokerPoll}, wakeups.LeasesChanged, polled, quarantined)
		leases = poller
		if err := mgr.Add(poller); err != nil {
			return nil, err
		}
	}
	recorder := mgr.GetEventRecorder(EventSource)
	if err := proxypool.New(mgr.GetClient(), leases, wakeups, recorder, log, proxypool.Options{}).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the ProxyPool controller: %w", err)
	}
	if err := autoscaler.New(mgr.GetClient(), leases, scaling, recorder, nil).SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("setting up the ProxyPool autoscaler: %w", err)
	}
	return leases, nil
}

// addSourceController adds the ProxySource reconciler, with a cache of
// its own for what sources read: ConfigMaps labelled proxy-source and
// Secrets labelled proxy-credentials (lists, URL credentials, vendor
// passwords, and the members' credentials it writes), in the namespaces
// whose Secrets are read.
func addSourceController(mgr ctrl.Manager, log *slog.Logger, o Options, leases leaseview.Source, meter proxysource.Meter) error {
	byObject := kube.CredentialSecrets(o.secretNamespaces)
	for obj, by := range kube.ConfigMapsLabelled(v1.LabelProxySource, o.secretNamespaces) {
		byObject[obj] = by
	}
	sources, err := cache.New(mgr.GetConfig(), cache.Options{Scheme: mgr.GetScheme(), ByObject: byObject})
	if err != nil {
		return err
	}
	if err := mgr.Add(sources); err != nil {
		return err
	}
	rec := proxysource.New(mgr.GetClient(), sources, leases, mgr.GetEventRecorder(EventSource), log.With("controller", "proxysource"),
		proxysource.Options{Egress: o.egress, Deny: o.deny, Meter: meter, SecretNamespaces: o.secretNamespaces})
	if err := rec.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the ProxySource controller: %w", err)
	}
	return nil
}

// dialBroker is the controller's one client of the lease API, over TLS
// when --broker-ca-file is set.
func dialBroker(ctx context.Context, log *slog.Logger, o Options) (*leaseclient.Client, error) {
	tokenFile := o.BrokerTokenFile
	if _, err := os.Stat(tokenFile); tokenFile != "" && errors.Is(err, fs.ErrNotExist) {
		// An optional Secret not created yet: the broker, which needs
		// it too, is not serving; drains wait for their deadlines.
		log.Warn("the broker token file does not exist; reading leases without a token", "file", tokenFile)
		tokenFile = ""
	}
	token, err := auth.FromFlag(ctx, log, "--broker-token-file", tokenFile)
	if err != nil {
		return nil, service.Usagef("%v", err)
	}
	opts := []leaseclient.Option{leaseclient.WithTokenSource(token)}
	if o.BrokerCAFile != "" {
		tlsOpt, err := leaseclient.WithCAFile(o.BrokerCAFile)
		if err != nil {
			return nil, service.Usagef("--broker-ca-file: %v", err)
		}
		opts = append(opts, tlsOpt)
	}
	broker, err := leaseclient.Dial(o.BrokerAddr, opts...)
	if err != nil {
		return nil, service.Usagef("--broker-address: %v", err)
	}
	return broker, nil
}

// EventSource is the reporting controller of every Event the controller
// emits, lifecycle and health alike: one name to filter them by.
const EventSource = "egress-proxies-controller"

// addProbeHub opens the probe endpoint and adds the hub, which serves the
// prober fleet while this replica leads, and the health engine behind it,
// which it returns.
func addProbeHub(ctx context.Context, mgr ctrl.Manager, log *slog.Logger, o Options, probeTLS *tls.Config, probeToken *auth.Token) (*health.Engine, error) {
	// A cache of its own: the manager's holds only cloud-init Secrets, and
	// a label selector cannot take either of two labels.
	creds, err := cache.New(mgr.GetConfig(), cache.Options{Scheme: mgr.GetScheme(), ByObject: kube.CredentialSecrets(o.secretNamespaces)})
	if err != nil {
		return nil, err
	}
	if err := mgr.Add(creds); err != nil {
		return nil, err
	}
	engine := health.NewEngine(mgr.GetClient(), mgr.GetEventRecorder(EventSource), mgr.Elected(), log.With("controller", "health"),
		health.EngineOptions{Workers: o.HealthWriters, StaleIntervals: o.StaleIntervals})
	hub := health.NewHub(engine, mgr.Elected(), log.With("controller", "probe-hub"), health.HubOptions{
		Addr: o.ProbeAddr, TLS: probeTLS, Token: probeToken, Defaults: o.Health, Deny: o.deny, Egress: o.egress,
		Credentials: kube.ProxyCredentials{Key: o.credentialsKey, Secrets: creds, Namespaces: o.secretNamespaces},
	})
	if _, err := hub.Listen(); err != nil {
		return nil, service.UsageError{Err: err}
	}
	if err := hub.Watch(ctx, mgr.GetCache()); err != nil {
		return nil, err
	}
	if err := hub.WatchCredentials(ctx, creds, mgr.GetCache()); err != nil {
		return nil, err
	}
	return engine, mgr.Add(hub)
}

// podNamespace is the flag's value, else the pod's namespace, else
// "default" for a controller run outside a cluster (make run-dev).
func podNamespace(log *slog.Logger, flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	log.Info("not in a cluster and --namespace unset: using namespace default")
	return "default"
}
