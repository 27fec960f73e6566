// Command broker serves the lease API over gRPC and REST, keeping every
// lease and cooldown in Redis, and reads the proxy inventory from a
// read-only watch of Proxy objects.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/pkg/version"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/server"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

var hashTag = regexp.MustCompile(`\{[^{}]+\}`)

func main() {
	os.Exit(run(os.Args[1:]))
}

type options struct {
	common            service.Common
	opsAddr           string
	pprofAddr         string
	grpcAddr          string
	httpAddr          string
	kubeconfig        string
	namespace         string
	redisAddrs        string
	redisMaster       string
	redisPasswordFile string
	redisDB           int
	redisPrefix       string
	redisWait         store.Wait
	tokenFile         string
	leases            leases.Config
	indexes           index.Maintainer
	maxBody           int64
}

func (o *options) register(fs *flag.FlagSet) {
	o.common.Register(fs)
	d := leases.DefaultConfig
	fs.StringVar(&o.opsAddr, "ops-addr", ":8081", "address of /healthz, /readyz and /metrics")
	fs.StringVar(&o.pprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof profiles; empty means off")
	fs.StringVar(&o.grpcAddr, "grpc-addr", ":9090", "address of the gRPC LeaseService")
	fs.StringVar(&o.httpAddr, "http-addr", ":8090", "address of the REST gateway")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config or $KUBECONFIG")
	fs.StringVar(&o.namespace, "namespace", "", "serve only Proxies of this namespace; empty means all")
	fs.StringVar(&o.redisAddrs, "redis-addrs", "127.0.0.1:6379", "Redis address; several comma-separated for Cluster, or Sentinels with --redis-master-name")
	fs.StringVar(&o.redisMaster, "redis-master-name", "", "Sentinel master name (makes --redis-addrs Sentinel addresses)")
	fs.StringVar(&o.redisPasswordFile, "redis-password-file", "", "file holding the Redis password")
	fs.IntVar(&o.redisDB, "redis-db", 0, "Redis database (not in Cluster mode)")
	fs.StringVar(&o.redisPrefix, "redis-key-prefix", store.DefaultPrefix, "prefix of every key; it must hold a {hash tag}. Brokers with different prefixes (say, one Deployment per namespace) keep separate state, on different Cluster shards")
	fs.IntVar(&o.redisWait.Replicas, "redis-wait-replicas", 0, "after each lease change, wait for this many replicas to acknowledge it (Redis WAIT), so a failover cannot lose it; 0 answers at once")
	fs.DurationVar(&o.redisWait.Timeout, "redis-wait-timeout", 100*time.Millisecond, "longest wait for --redis-wait-replicas; a lease change not acknowledged in time is answered UNAVAILABLE (Redis may hold it: a retry with the same requestId finds it) and counted in broker_redis_wait_shortfalls_total")
	fs.DurationVar(&o.indexes.Resync, "index-resync", index.DefaultResync, "how often every selector index is checked against the inventory")
	fs.DurationVar(&o.indexes.Idle, "index-idle", index.DefaultIdle, "how long a selector index nobody leases from is kept")
	fs.IntVar(&o.indexes.MaxIndexes, "max-indexes", index.DefaultMaxIndexes, "most selector indexes kept at once (distinct namespace and selector pairs in use); the least recently used go first")
	fs.StringVar(&o.tokenFile, "token-file", "", "file holding the bearer token clients must send; empty serves unauthenticated")
	fs.DurationVar(&o.leases.DefaultTTL, "default-ttl", d.DefaultTTL, "lease TTL when a request gives ttlSeconds 0")
	fs.DurationVar(&o.leases.MinTTL, "min-ttl", d.MinTTL, "shortest lease TTL a request may ask for")
	fs.DurationVar(&o.leases.MaxTTL, "max-ttl", d.MaxTTL, "longest lease TTL a request may ask for")
	fs.DurationVar(&o.leases.Cooldown, "cooldown", d.Cooldown, "how long a rate_limited report keeps a proxy away from that target")
	fs.IntVar(&o.leases.LeaseCap, "lease-cap", d.LeaseCap, "most live leases per proxy (0: no cap)")
	fs.Int64Var(&o.maxBody, "max-body-bytes", 64<<10, "largest REST request body")
}

func (o *options) validate() error {
	l := o.leases
	switch {
	case l.MinTTL <= 0 || l.MaxTTL < l.MinTTL:
		return fmt.Errorf("--min-ttl must be positive and not above --max-ttl")
	case l.DefaultTTL < l.MinTTL || l.DefaultTTL > l.MaxTTL:
		return fmt.Errorf("--default-ttl %s must be between --min-ttl %s and --max-ttl %s", l.DefaultTTL, l.MinTTL, l.MaxTTL)
	case l.Cooldown <= 0:
		return fmt.Errorf("--cooldown must be positive")
	case l.LeaseCap < 0:
		return fmt.Errorf("--lease-cap must not be negative")
	case o.maxBody <= 0:
		return fmt.Errorf("--max-body-bytes must be positive")
	case !hashTag.MatchString(o.redisPrefix):
		return fmt.Errorf("--redis-key-prefix %q must hold a non-empty {hash tag}, so each script's keys share one Cluster slot", o.redisPrefix)
	case o.redisWait.Replicas < 0 || o.redisWait.Timeout <= 0:
		return fmt.Errorf("--redis-wait-replicas must not be negative and --redis-wait-timeout must be positive")
	case o.indexes.Resync <= 0 || o.indexes.Idle <= 0 || o.indexes.MaxIndexes < 1:
		return fmt.Errorf("--index-resync and --index-idle must be positive and --max-indexes at least 1")
	}
	return nil
}

func run(args []string) int {
	var o options
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	o.register(fs)
	return service.Run("broker", "BROKER", args, os.Stderr, fs, &o.common, func(ctx context.Context, env service.Env) error {
		log := env.Log
		if err := o.validate(); err != nil {
			return service.UsageError{Err: err}
		}
		tok, err := auth.FromFlag(ctx, log, "--token-file", o.tokenFile)
		if err != nil {
			return service.UsageError{Err: err}
		}
		if !tok.Enabled() {
			log.Warn("NO TOKEN CONFIGURED: the lease API serves every caller UNAUTHENTICATED; set --token-file (BROKER_TOKEN_FILE) to a mounted Secret")
		}

		cfg, err := kube.RestConfig(o.kubeconfig)
		if err != nil {
			return service.Usagef("--kubeconfig: %v", err)
		}
		ropts := store.ClientOptions(strings.Split(o.redisAddrs, ","), o.redisMaster)
		ropts.DB = o.redisDB
		if o.redisPasswordFile != "" {
			b, err := os.ReadFile(o.redisPasswordFile)
			if err != nil {
				return service.Usagef("--redis-password-file: %v", err)
			}
			ropts.Password = strings.TrimSpace(string(b))
		}
		rdb := redis.NewUniversalClient(ropts)
		defer func() { _ = rdb.Close() }()
		if env.Tracing {
			// No caller or statement attributes: finding the caller walks
			// the stack on every command, a tenth of a lease's CPU, and
			// statements would put lease ids in traces.
			if err := redisotel.InstrumentTracing(rdb, redisotel.WithCallerEnabled(false), redisotel.WithDBStatement(false)); err != nil {
				return err
			}
		}

		st := store.New(rdb, o.redisPrefix)
		st.Wait = o.redisWait
		// A few round trips in flight keep Redis busy while another is on
		// the wire.
		st.Pipeline(ctx, 4)
		idx := &o.indexes
		idx.Store, idx.Log, idx.Scope = st, log, o.namespace
		inv := inventory.New(idx.Changed)
		idx.Inv = inv
		if err := inv.Run(ctx, cfg, o.namespace); err != nil {
			return err
		}
		go idx.Run(ctx)
		svc := leases.New(inv, st, idx, o.leases)
		srv, err := server.New(ctx, log, server.Options{GRPCAddr: o.grpcAddr, HTTPAddr: o.httpAddr, MaxBodyBytes: o.maxBody, MaxRecvBytes: 1 << 20, Tracing: env.Tracing}, svc, tok)
		if err != nil {
			return service.UsageError{Err: err}
		}

		ops := service.NewOps()
		ops.Registry.MustRegister(append(append(append(leases.Collectors(), server.Collectors()...), index.Collectors()...), store.Collectors()...)...)
		ops.AddReadyCheck("redis", st.Ping)
		ops.AddReadyCheck("inventory", func(context.Context) error {
			if !inv.Synced() {
				return errors.New("proxy inventory not synced with the API server yet")
			}
			return nil
		})
		waitOps, err := service.Serve(ctx, log, "ops", o.opsAddr, ops.Handler())
		if err != nil {
			return service.UsageError{Err: err}
		}
		if o.pprofAddr != "" {
			waitPprof, err := service.Serve(ctx, log, "pprof", o.pprofAddr, service.Pprof())
			if err != nil {
				return service.UsageError{Err: err}
			}
			defer func() { _ = waitPprof() }()
		}
		log.Info("starting", "commit", version.Commit, "leaseCap", o.leases.LeaseCap, "cooldown", o.leases.Cooldown, "auth", tok.Enabled())
		serveErr := srv.Serve(ctx)
		return errors.Join(serveErr, waitOps())
	})
}
