// Package app wires the broker: Redis, the proxy inventory and its
// selector indexes, the lease service, its gRPC and REST servers, and the
// ops endpoint. Every service has an app package of this shape: Options
// (flags and their checks) and Run, a few named steps.
package app

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/filewatch"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/pkg/version"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/gateway"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/server"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Name is the broker's name in logs and flags' environment variables.
const Name = "broker"

// Run runs the broker until ctx ends.
func Run(ctx context.Context, env service.Env, o Options) error {
	log := env.Log
	tok, err := auth.FromFlag(ctx, log, "--token-file", o.TokenFile)
	if err != nil {
		return service.UsageError{Err: err}
	}
	if o.GatewayTokenFile != "" {
		gw, err := auth.FromGatewayFile(ctx, log, o.GatewayTokenFile, filewatch.Interval)
		if err != nil {
			return service.UsageError{Err: fmt.Errorf("--gateway-token-file: %w", err)}
		}
		tok = auth.Merge(tok, gw)
	}
	tenants := &access.Registry{File: tok, Log: log}
	var tenantClient client.Client
	if o.TenantNamespace != "" {
		if tenantClient, err = watchTenants(ctx, o, tenants); err != nil {
			return err
		}
	}
	if !tenants.Enabled() {
		log.Warn("NO CREDENTIALS CONFIGURED: the lease API serves every caller UNAUTHENTICATED, and leases carry no proxy credentials; set --token-file (BROKER_TOKEN_FILE) to a mounted Secret, or --tenant-namespace")
	}
	o.Leases.ShareCredentials = tenants.Enabled()
	rdb, err := redisClient(ctx, log, o, env.Tracing)
	if err != nil {
		return err
	}
	defer func() { _ = rdb.Close() }()
	st := store.New(rdb, o.RedisPrefix)
	st.Wait = o.RedisWait
	// Two round trips in flight keep Redis busy while one is on the wire;
	// more make smaller batches, which cost Redis more per lease
	// (decision 115).
	st.Pipeline(ctx, 2)
	if tenantClient != nil {
		if err := writeTenantStatus(ctx, log, o, tenantClient, tenants, st); err != nil {
			return err
		}
	}

	inv, idx, err := watchProxies(ctx, o, st, env)
	if err != nil {
		return err
	}
	inv.Credentials.Key = o.credentialsKey
	pol := &policy.Policies{Defaults: o.Policy, Log: log}
	if err := pol.Watch(ctx, inv.Cache()); err != nil {
		return err
	}
	serverTLS, err := servingTLS(ctx, log, o)
	if err != nil {
		return err
	}
	o.Leases.Reauthorize = func(c access.Caller) (access.Caller, error) { return tenants.Recheck(c, access.Watch) }
	svc := leases.New(inv, st, idx, pol, o.Leases)
	go svc.RunWatches(ctx)
	srv, err := server.New(ctx, log, server.Options{GRPCAddr: o.GRPCAddr, HTTPAddr: o.HTTPAddr, MaxBodyBytes: o.MaxBody, MaxRecvBytes: 1 << 20, Tracing: env.Tracing, TLS: serverTLS, Limits: o.Limits, Console: o.Console},
		leases.GRPC(svc), tenants)
	if err != nil {
		return service.UsageError{Err: err}
	}
	srv.FollowHealth(ctx, 2*time.Second, st.Ping)
	if serverTLS != nil {
		// The gateway speaks HTTP/1.1 (CONNECT) only, whatever the
		// client offers.
		o.Gateway.TLS = serverTLS.Clone()
		o.Gateway.TLS.NextProtos = []string{"http/1.1"}
	}
	o.Gateway.Meter = st
	waitGateway, err := serveGateway(ctx, log, o, svc, tenants)
	if err != nil {
		return err
	}
	waitOps, err := serveOps(ctx, o, env, st, inv, pol)
	if err != nil {
		return err
	}
	log.Info("starting", "commit", version.Commit, "leaseCap", o.Leases.LeaseCap, "cooldown", o.Policy.CooldownBase, "banAware", o.Leases.BanAware, "auth", tenants.Enabled(), "tenantNamespace", o.TenantNamespace, "tls", serverTLS != nil, "gateway", o.Gateway.Addr)
	serveErr := srv.Serve(ctx)
	return errors.Join(serveErr, waitGateway(), waitOps())
}

// serveGateway serves the HTTP proxy gateway when --gateway-addr is set,
// leasing from svc as the callers its proxy passwords name; the returned
// func waits until it stopped and released every lease it held.
func serveGateway(ctx context.Context, log *slog.Logger, o Options, svc *leases.Service, callers *access.Registry) (func() error, error) {
	if o.Gateway.Addr == "" {
		return func() error { return nil }, nil
	}
	gw, err := gateway.New(log, o.Gateway, svc, callers)
	if err != nil {
		return nil, service.UsageError{Err: err}
	}
	log.Info("gateway listening", "addr", gw.Addr(), "tlsAddr", gw.TLSAddr(), "egressDeny", o.Gateway.Egress.Deny.String(), "egressAllowance", o.Gateway.Egress.Allowance.String())
	errc := make(chan error, 1)
	go func() { errc <- gw.Serve(ctx) }()
	return func() error { return <-errc }, nil
}

// servingTLS is the listeners' TLS from --tls-cert-file and --tls-key-file,
// re-read when they change (cert-manager rotates the Secret), or nil.
func servingTLS(ctx context.Context, log *slog.Logger, o Options) (*tls.Config, error) {
	if o.TLSCert == "" {
		return nil, nil
	}
	cert, err := certs.NewReloading(ctx, log, o.TLSCert, o.TLSKey)
	if err != nil {
		return nil, service.Usagef("--tls-cert-file: %v", err)
	}
	return cert.ServerConfig(), nil
}

// redisClient connects to a single Redis, a Sentinel set-up or a Cluster,
// as --redis-addrs and --redis-master-name say, authenticated and over TLS
// as the --redis-* flags say.
func redisClient(ctx context.Context, log *slog.Logger, o Options, tracing bool) (redis.UniversalClient, error) {
	ropts := store.ClientOptions(strings.Split(o.RedisAddrs, ","), o.RedisMaster)
	ropts.DB = o.RedisDB
	if o.RedisPasswordFile != "" {
		pw, err := filewatch.FollowFile(ctx, log, filewatch.Interval, "Redis password file", o.RedisPasswordFile, filewatch.String)
		if err != nil {
			return nil, service.Usagef("--redis-password-file: %v", err)
		}
		// Each new connection authenticates with the file's current
		// content: a rotated password takes effect without a restart.
		ropts.CredentialsProvider = func() (string, string) { return o.RedisUsername, pw.Value() }
	}
	if o.RedisSentinelPasswordFile != "" {
		b, err := os.ReadFile(o.RedisSentinelPasswordFile)
		if err != nil {
			return nil, service.Usagef("--redis-sentinel-password-file: %v", err)
		}
		ropts.SentinelUsername, ropts.SentinelPassword = o.RedisSentinelUsername, strings.TrimSpace(string(b))
	}
	if o.RedisTLSCAFile != "" {
		pool, err := certs.LoadPool(o.RedisTLSCAFile)
		if err != nil {
			return nil, service.Usagef("--redis-tls-ca-file: %v", err)
		}
		ropts.TLSConfig = &tls.Config{RootCAs: pool, ServerName: o.RedisTLSServer, MinVersion: tls.VersionTLS12}
	}
	rdb := redis.NewUniversalClient(ropts)
	if tracing {
		// No caller or statement attributes: finding the caller walks
		// the stack on every command, a tenth of a lease's CPU, and
		// statements would put lease ids in traces.
		if err := redisotel.InstrumentTracing(rdb, redisotel.WithCallerEnabled(false), redisotel.WithDBStatement(false)); err != nil {
			_ = rdb.Close()
			return nil, err
		}
	}
	return rdb, nil
}

// watchProxies starts the read-only Proxy inventory and the maintainer
// that keeps the selector indexes in Redis current from it.
func watchProxies(ctx context.Context, o Options, st *store.Store, env service.Env) (*inventory.Inventory, *index.Maintainer, error) {
	cfg, err := kube.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, nil, service.Usagef("--kubeconfig: %v", err)
	}
	idx := &index.Maintainer{Store: st, Log: env.Log, Scope: o.Namespace, SecretNamespaces: o.secretNamespaces, NoSecrets: !o.CredentialsSecrets, Resync: o.IndexResync, Idle: o.IndexIdle, MaxIndexes: o.MaxIndexes}
	inv, err := idx.Start(ctx, cfg)
	return inv, idx, err
}

// watchTenants keeps tenants current from the Tenants in
// --tenant-namespace, whose credentials it reads Secret by Secret (the
// brokers may get those Secrets and list none); it returns the client
// that reads them, which writes the Tenants' status too.
func watchTenants(ctx context.Context, o Options, tenants *access.Registry) (client.Client, error) {
	cfg, err := kube.RestConfig(o.Kubeconfig)
	if err != nil {
		return nil, service.Usagef("--kubeconfig: %v", err)
	}
	c, err := cache.New(cfg, cache.Options{Scheme: kube.NewScheme(), DefaultNamespaces: map[string]cache.Config{o.TenantNamespace: {}}})
	if err != nil {
		return nil, fmt.Errorf("creating the Tenant informer: %w", err)
	}
	direct, err := client.New(cfg, client.Options{Scheme: kube.NewScheme()})
	if err != nil {
		return nil, fmt.Errorf("creating the Secret reader: %w", err)
	}
	go func() { _ = c.Start(ctx) }()
	return direct, tenants.Watch(ctx, c, direct, access.DefaultReread)
}

// writeTenantStatus has this broker record whom it served, and write the
// Tenants' status while it leads --tenant-status-lease.
func writeTenantStatus(ctx context.Context, log *slog.Logger, o Options, c client.Client, tenants *access.Registry, st *store.Store) error {
	cfg, err := kube.RestConfig(o.Kubeconfig)
	if err != nil {
		return service.Usagef("--kubeconfig: %v", err)
	}
	leading, err := elect(ctx, log, cfg, o.TenantNamespace, o.TenantStatusLease)
	if err != nil {
		return err
	}
	w := &access.StatusWriter{Client: c, Registry: tenants, Fleet: st, Leading: leading, Interval: access.DefaultStatusInterval, Log: log}
	go w.Run(ctx)
	return nil
}

// serveOps serves /healthz, /readyz (Redis answers, the inventory and
// the TargetPolicies have synced) and /metrics, and pprof when asked; the returned func waits for
// them to stop.
func serveOps(ctx context.Context, o Options, env service.Env, st *store.Store, inv *inventory.Inventory, pol *policy.Policies) (func() error, error) {
	ops := service.NewOps()
	ops.Registry.MustRegister(append(append(append(append(append(leases.Collectors(), server.Collectors()...), index.Collectors()...), store.Collectors()...), gateway.Collectors()...), access.Collectors()...)...)
	ops.Registry.MustRegister(store.FleetCollector(st))
	ops.AddReadyCheck("redis", st.Ping)
	ops.AddReadyCheck("inventory", func(context.Context) error {
		if !inv.Synced() {
			return errors.New("proxy inventory not synced with the API server yet")
		}
		return nil
	})
	ops.AddReadyCheck("targetpolicies", func(context.Context) error {
		if !pol.Synced() {
			return errors.New("TargetPolicies not synced with the API server yet (is the TargetPolicy CRD installed?)")
		}
		return nil
	})
	waitOps, err := service.Serve(ctx, env.Log, "ops", o.OpsAddr, ops.Handler(), o.Limits)
	if err != nil {
		return nil, service.UsageError{Err: err}
	}
	if o.PprofAddr == "" {
		return waitOps, nil
	}
	waitPprof, err := service.Serve(ctx, env.Log, "pprof", o.PprofAddr, service.Pprof(), o.Limits)
	if err != nil {
		return nil, service.UsageError{Err: err}
	}
	return func() error { return errors.Join(waitOps(), waitPprof()) }, nil
}
