// Package cli is kubectl-egress: each verb reads the cluster through the
// user's kubeconfig (so it can do nothing the user's RBAC forbids) and
// the lease API through a port-forward to a broker pod, or an address.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/kube"
)

// Main runs the plugin with args and returns its exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	root, cleanup := newRoot(stdout, stderr)
	defer cleanup()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(stderr, "error:", err)
		var ex *exitError
		if errors.As(err, &ex) {
			return ex.code
		}
		return 1
	}
	return 0
}

// exitError ends the plugin with code: a check that found faults.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// env is what every verb works with.
type env struct {
	out, errOut io.Writer
	flags       clientcmd.ClientConfig
	// release and releaseNS name the install.
	release, releaseNS string
	// broker is the lease API's gRPC address; empty: port-forward.
	broker, token, caFile, serverName string
	// insecure allows plaintext to a --broker off this machine.
	insecure bool
	output   string
	timeout  time.Duration
	// namespace is -n, or the kubeconfig context's.
	namespace     string
	allNamespaces bool

	restConfig *rest.Config
	kube       client.Client
	// cancel ends the verb's timeout.
	cancel context.CancelFunc
}

func newRoot(stdout, stderr io.Writer) (*cobra.Command, func()) {
	e := &env{out: stdout, errOut: stderr, cancel: func() {}}
	root := &cobra.Command{
		Use:   "kubectl-egress",
		Short: "The operator's window on egress-proxies: why the fleet does what it does",
		Long: `kubectl egress reads the fleet through your kubeconfig and the brokers'
lease API (through a port-forward to a broker pod unless --broker is
given). Every verb that changes something prints the patch it applies and
takes --dry-run.`,
		SilenceUsage: true, SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error { return e.init(cmd) },
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	pf := root.PersistentFlags()
	pf.StringVar(&rules.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file")
	pf.StringVar(&overrides.CurrentContext, "context", "", "the kubeconfig context to use")
	pf.StringVarP(&overrides.Context.Namespace, "namespace", "n", "", "the namespace of the proxies and pools (default: the context's)")
	pf.BoolVarP(&e.allNamespaces, "all-namespaces", "A", false, "every namespace")
	pf.StringVar(&e.release, "release", "egress-proxies", "the Helm release of the install")
	pf.StringVar(&e.releaseNS, "release-namespace", "egress-proxies-system", "the namespace the install runs in")
	pf.StringVar(&e.broker, "broker", "", "the lease API's gRPC address (host:port); default: a port-forward to a broker pod")
	pf.StringVar(&e.token, "token", "", "the lease API's bearer token; default: $EGRESS_PROXIES_TOKEN, else the release's discovery token Secret")
	pf.StringVar(&e.caFile, "ca-file", "", "the CA of the brokers' TLS certificate; default: ca.crt of their TLS Secret")
	pf.BoolVar(&e.insecure, "insecure", false, "allow --broker off loopback without TLS: the token then crosses the network in plaintext")
	pf.StringVar(&e.serverName, "tls-server-name", "", "the name the brokers' certificate is checked for; default: <release>-broker-grpc.<namespace>.svc")
	pf.DurationVar(&e.timeout, "timeout", 30*time.Second, "how long one verb may take")
	e.flags = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)

	root.AddCommand(e.statusCmd(), e.explainCmd(), e.bansCmd(), e.leasesCmd(), e.sessionsCmd(),
		e.cordonCmd(true), e.cordonCmd(false), e.drainCmd(), e.rotateCmd(), e.checkCmd(), e.reportCmd())
	return root, func() { e.cancel() }
}

// outputFlag adds -o to a read.
func (e *env) outputFlag(cmd *cobra.Command) *cobra.Command {
	cmd.Flags().StringVarP(&e.output, "output", "o", "", "json or yaml instead of a table")
	return cmd
}

func (e *env) init(cmd *cobra.Command) error {
	if cmd.Name() == "help" || cmd.Name() == "completion" || (cmd.Parent() != nil && cmd.Parent().Name() == "completion") {
		return nil // they need no cluster
	}
	switch e.output {
	case "", "json", "yaml":
	default:
		return fmt.Errorf("--output %q: use json or yaml, or leave it out for a table", e.output)
	}
	cfg, err := e.flags.ClientConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	e.restConfig = cfg
	if e.namespace, _, err = e.flags.Namespace(); err != nil {
		return fmt.Errorf("reading the kubeconfig's namespace: %w", err)
	}
	if e.kube, err = client.New(cfg, client.Options{Scheme: kube.NewScheme()}); err != nil {
		return fmt.Errorf("connecting to the cluster: %w", err)
	}
	if e.token == "" {
		e.token = os.Getenv("EGRESS_PROXIES_TOKEN")
	}
	if e.timeout > 0 {
		var ctx context.Context
		ctx, e.cancel = context.WithTimeout(cmd.Context(), e.timeout)
		cmd.SetContext(ctx)
	}
	return nil
}

// scope is the namespace a read covers: "" for every one.
func (e *env) scope() string {
	if e.allNamespaces {
		return ""
	}
	return e.namespace
}
