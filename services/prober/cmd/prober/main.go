// Command prober is one member of the probe fleet: it connects to the
// controller over gRPC, probes the proxies assigned to it through real
// CONNECT tunnels, and streams the results back. It holds no Kubernetes
// credentials; scale it on its own.
package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"os"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/pkg/version"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/agent"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type options struct {
	common         service.Common
	opsAddr        string
	controllerAddr string
	tokenFile      string
	id             string
	concurrency    int
	caFile         string
	denyCIDRs      string
}

func run(args []string) int {
	var o options
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("prober", flag.ContinueOnError)
	o.common.Register(fs)
	fs.StringVar(&o.opsAddr, "ops-addr", ":8081", "address of /healthz, /readyz and /metrics")
	fs.StringVar(&o.controllerAddr, "controller-addr", "", "host:port of the controller's probe endpoint (required)")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token the controller expects; empty sends none")
	fs.StringVar(&o.id, "id", host, "this prober's stable id (the pod name in-cluster)")
	fs.IntVar(&o.concurrency, "concurrency", 256, "probes in flight at most (bounds file descriptors); size it to at least assigned proxies x timeout / interval")
	fs.StringVar(&o.caFile, "ca-file", "", "PEM CA bundle to verify probe targets with instead of the system roots")
	fs.StringVar(&o.denyCIDRs, "deny-cidrs", netpolicy.DefaultDenyCIDRs, "comma-separated CIDRs no probe dials, checked after name resolution (keep it equal to the controller's --probe-deny-cidrs); private ranges stay allowed")
	return service.Run("prober", "PROBER", args, os.Stderr, fs, &o.common, func(ctx context.Context, env service.Env) error {
		if o.controllerAddr == "" {
			return service.Usagef("--controller-addr is required (PROBER_CONTROLLER_ADDR)")
		}
		if o.id == "" || o.concurrency < 1 {
			return service.Usagef("--id must not be empty and --concurrency must be at least 1")
		}
		deny, err := netpolicy.Parse(o.denyCIDRs)
		if err != nil {
			return service.Usagef("--deny-cidrs: %v", err)
		}
		var roots *x509.CertPool
		if o.caFile != "" {
			pem, err := os.ReadFile(o.caFile)
			if err != nil {
				return service.Usagef("--ca-file: %v", err)
			}
			roots = x509.NewCertPool()
			if !roots.AppendCertsFromPEM(pem) {
				return service.Usagef("--ca-file %s holds no PEM certificate", o.caFile)
			}
		}
		tok, err := auth.FromFlag(ctx, env.Log, "--token-file", o.tokenFile)
		if err != nil {
			return service.UsageError{Err: err}
		}
		dial := []grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
			// Notice a controller that vanished without closing the connection.
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		}
		if tok != nil {
			dial = append(dial, tok.DialOption())
		}
		// Checked once here so a bad address is a usage error, not a
		// reconnect loop.
		probeConn, err := grpc.NewClient(o.controllerAddr, dial...)
		if err != nil {
			return service.Usagef("--controller-addr: %v", err)
		}
		_ = probeConn.Close()

		ops := service.NewOps()
		ops.Registry.MustRegister(agent.Collectors()...)
		waitOps, err := service.Serve(ctx, env.Log, "ops", o.opsAddr, ops.Handler())
		if err != nil {
			return service.UsageError{Err: err}
		}
		env.Log.Info("starting", "id", o.id, "controller", o.controllerAddr, "concurrency", o.concurrency, "commit", version.Commit, "auth", tok.Enabled())
		a := &agent.Agent{ID: o.id, Concurrency: o.concurrency, Prober: &probe.Prober{RootCAs: roots, Deny: deny}, Log: env.Log,
			Dial: func() (*grpc.ClientConn, error) { return grpc.NewClient(o.controllerAddr, dial...) }}
		return errors.Join(a.Run(ctx), waitOps())
	})
}
