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
	"fmt"
	"os"
	"slices"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
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
	controllerCA   string
	serverName     string
	insecure       bool
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
	fs.StringVar(&o.controllerCA, "controller-ca-file", "", "PEM CA bundle the controller's probe endpoint certificate is verified with (re-read on every reconnect)")
	fs.StringVar(&o.serverName, "controller-server-name", "", "name the controller's certificate must hold; empty means the host of --controller-addr")
	fs.BoolVar(&o.insecure, "controller-insecure", false, "connect to the controller in plaintext, without TLS: for local development only")
	fs.StringVar(&o.denyCIDRs, "deny-cidrs", netpolicy.DefaultDenyCIDRs, "comma-separated CIDRs no probe dials, checked after name resolution (keep it equal to the controller's --probe-deny-cidrs); private ranges stay allowed")
	return service.Run("prober", "PROBER", args, os.Stderr, fs, &o.common, func(ctx context.Context, env service.Env) error {
		if o.controllerAddr == "" {
			return service.Usagef("--controller-addr is required (PROBER_CONTROLLER_ADDR)")
		}
		if o.id == "" || o.concurrency < 1 {
			return service.Usagef("--id must not be empty and --concurrency must be at least 1")
		}
		switch {
		case o.insecure && o.controllerCA != "":
			return service.Usagef("--controller-insecure contradicts --controller-ca-file: choose one")
		case !o.insecure && o.controllerCA == "":
			return service.Usagef("--controller-ca-file is required: the probe stream runs over TLS (--controller-insecure connects in plaintext, for local development only)")
		}
		deny, err := netpolicy.Parse(o.denyCIDRs)
		if err != nil {
			return service.Usagef("--deny-cidrs: %v", err)
		}
		var roots *x509.CertPool
		if o.caFile != "" {
			if roots, err = certs.LoadPool(o.caFile); err != nil {
				return service.Usagef("--ca-file: %v", err)
			}
		}
		tok, err := auth.FromFlag(ctx, env.Log, "--token-file", o.tokenFile)
		if err != nil {
			return service.UsageError{Err: err}
		}
		// TLS is built per connection, so a rotated CA bundle is read at
		// the next reconnect.
		transport := func() (grpc.DialOption, error) {
			if o.insecure {
				return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
			}
			cfg, err := certs.ClientConfig(o.controllerCA, o.serverName)
			if err != nil {
				return nil, fmt.Errorf("--controller-ca-file: %w", err)
			}
			return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
		}
		dial := []grpc.DialOption{
			grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
			// Notice a controller that vanished without closing the connection.
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		}
		if tok != nil {
			dial = append(dial, tok.DialOption())
		}
		connect := func() (*grpc.ClientConn, error) {
			creds, err := transport()
			if err != nil {
				return nil, err
			}
			conn, err := grpc.NewClient(o.controllerAddr, append(slices.Clip(dial), creds)...)
			if err != nil {
				return nil, fmt.Errorf("--controller-addr: %w", err)
			}
			return conn, nil
		}
		// Once here, so a bad address or CA file is a usage error, not a
		// reconnect loop.
		probeConn, err := connect()
		if err != nil {
			return service.UsageError{Err: err}
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
			Dial: connect}
		return errors.Join(a.Run(ctx), waitOps())
	})
}
