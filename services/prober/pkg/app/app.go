// Package app wires a prober: the connection to the controller's probe
// endpoint, the agent that probes what it is assigned, and the ops
// endpoint. Every service has an app package of this shape: Options
// (flags and their checks) and Run, a few named steps.
package app

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/pkg/version"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/agent"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

// Name is the prober's name in logs and flags' environment variables.
const Name = "prober"

// Run runs the prober until ctx ends.
func Run(ctx context.Context, env service.Env, o Options) error {
	tok, err := auth.FromFlag(ctx, env.Log, "--token-file", o.TokenFile)
	if err != nil {
		return service.UsageError{Err: err}
	}
	connect, err := controllerDialer(o, tok)
	if err != nil {
		return err
	}
	ops := service.NewOps()
	ops.Registry.MustRegister(agent.Collectors()...)
	waitOps, err := service.Serve(ctx, env.Log, "ops", o.OpsAddr, ops.Handler(), service.DefaultLimits)
	if err != nil {
		return service.UsageError{Err: err}
	}
	env.Log.Info("starting", "id", o.ID, "controller", o.ControllerAddr, "concurrency", o.Concurrency, "commit", version.Commit, "auth", tok.Enabled())
	a := &agent.Agent{ID: o.ID, Concurrency: o.Concurrency, Prober: &probe.Prober{RootCAs: o.roots, Deny: o.deny, Egress: o.egress}, Log: env.Log, Dial: connect}
	return errors.Join(a.Run(ctx), waitOps())
}

// controllerDialer returns how the agent (re)connects to the controller.
// TLS is built per connection, so a rotated CA bundle is read at the next
// reconnect. It connects once here, so a bad address or CA file is a
// usage error, not a reconnect loop.
func controllerDialer(o Options, tok *auth.Token) (func() (*grpc.ClientConn, error), error) {
	transport := func() (grpc.DialOption, error) {
		if o.Insecure {
			return grpc.WithTransportCredentials(insecure.NewCredentials()), nil
		}
		cfg, err := certs.ClientConfig(o.ControllerCA, o.ServerName)
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
		conn, err := grpc.NewClient(o.ControllerAddr, append(slices.Clip(dial), creds)...)
		if err != nil {
			return nil, fmt.Errorf("--controller-addr: %w", err)
		}
		return conn, nil
	}
	conn, err := connect()
	if err != nil {
		return nil, service.UsageError{Err: err}
	}
	_ = conn.Close()
	return connect, nil
}
