// Package operator wires the controller's manager: the Kubernetes client
// and caches, leader election, the Proxy controllers, orphan GC, and the
// probe endpoint the prober fleet connects to.
package operator

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/service"
)

// Options are the controller's flags.
type Options struct {
	Common           service.Common
	Kubeconfig       string
	MetricsAddr      string
	HealthAddr       string
	LeaderElect      bool
	LeaderElectionID string
	LeaderElectionNS string
	LeaseDuration    time.Duration
}

// Register adds the flags to fs.
func (o *Options) Register(fs *flag.FlagSet) {
	o.Common.Register(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config or $KUBECONFIG")
	fs.StringVar(&o.MetricsAddr, "metrics-bind-address", ":8080", "address of /metrics")
	fs.StringVar(&o.HealthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.BoolVar(&o.LeaderElect, "leader-elect", true, "elect a leader so only one replica acts")
	fs.StringVar(&o.LeaderElectionID, "leader-election-id", "egress-proxies-controller", "name of the leader-election Lease")
	fs.StringVar(&o.LeaderElectionNS, "leader-election-namespace", "", "namespace of the leader-election Lease; empty means the pod's own")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", 15*time.Second, "how long a lost leader's lease blocks a new one")
}

func restConfig(path string) (*rest.Config, error) {
	if path == "" {
		return ctrl.GetConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}

// Run runs the manager until ctx ends.
func Run(ctx context.Context, log *slog.Logger, o Options) error {
	ctrl.SetLogger(logr.FromSlogHandler(log.Handler()))
	cfg, err := restConfig(o.Kubeconfig)
	if err != nil {
		return service.Usagef("--kubeconfig: %v", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  kube.NewScheme(),
		Metrics:                 metricsserver.Options{BindAddress: o.MetricsAddr},
		HealthProbeBindAddress:  o.HealthAddr,
		LeaderElection:          o.LeaderElect,
		LeaderElectionID:        o.LeaderElectionID,
		LeaderElectionNamespace: leaderElectionNamespace(log, o.LeaderElectionNS),
		LeaseDuration:           &o.LeaseDuration,
		// A replica that loses its lease exits rather than keep acting
		// on a stale view; Kubernetes restarts it as a follower.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// leaderElectionNamespace is the flag's value, else the pod's namespace,
// else "default" for a controller run outside a cluster (make run-dev).
func leaderElectionNamespace(log *slog.Logger, flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
		return strings.TrimSpace(string(b))
	}
	log.Info("not in a cluster and --leader-election-namespace unset: using namespace default for the leader-election Lease")
	return "default"
}
