package app

import (
	"errors"
	"flag"
	"fmt"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/gateway"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/policy"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// Options are the broker's flags.
type Options struct {
	OpsAddr           string
	PprofAddr         string
	GRPCAddr          string
	HTTPAddr          string
	Kubeconfig        string
	Namespace         string
	RedisAddrs        string
	RedisMaster       string
	RedisPasswordFile string
	RedisUsername     string
	RedisTLSCAFile    string
	RedisTLSServer    string
	// RedisSentinelPasswordFile and RedisSentinelUsername authenticate to
	// the Sentinels, which may ask for other credentials than Redis.
	RedisSentinelPasswordFile string
	RedisSentinelUsername     string
	RedisDB                   int
	RedisPrefix               string
	RedisWait                 store.Wait
	TokenFile                 string
	GatewayTokenFile          string
	TenantNamespace           string
	TenantStatusLease         string
	TLSCert                   string
	TLSKey                    string
	// CredentialsKeyFile: the controller's key Managed proxies'
	// credentials are derived from.
	CredentialsKeyFile string
	credentialsKey     proxyauth.Key
	Leases             leases.Config
	// Policy is what applies to a target no TargetPolicy matches, and
	// what a matching one leaves out.
	Policy policy.Target
	Limits service.Limits
	// SecretNamespaces: where Proxies' credentials Secrets are read.
	SecretNamespaces string
	secretNamespaces []string
	// CredentialsSecrets: read External proxies' credentials Secrets.
	CredentialsSecrets bool
	// Gateway is the proxy listener's; off while its Addr is empty.
	Gateway     gateway.Options
	EgressFlags netpolicy.EgressFlags
	IndexResync time.Duration
	IndexIdle   time.Duration
	MaxIndexes  int
	MaxBody     int64
	// Console serves the read-only web console on the REST port.
	Console bool
}

// Register adds the flags to fs.
func (o *Options) Register(fs *flag.FlagSet) {
	d := leases.DefaultConfig
	o.Limits = service.DefaultLimits
	o.Limits.Register(fs)
	fs.StringVar(&o.OpsAddr, "ops-addr", ":8081", "address of /healthz, /readyz and /metrics")
	fs.StringVar(&o.PprofAddr, "pprof-bind-address", "", "address of Go's /debug/pprof profiles; empty means off")
	fs.StringVar(&o.GRPCAddr, "grpc-addr", ":9090", "address of the gRPC LeaseService")
	fs.StringVar(&o.HTTPAddr, "http-addr", ":8090", "address of the REST gateway")
	g := gateway.DefaultOptions
	fs.StringVar(&o.Gateway.Addr, "gateway-addr", "", "address of the HTTP proxy gateway (CONNECT and plain HTTP; options in the proxy user name, the token as its password); empty means off. Needs --token-file")
	fs.DurationVar(&o.Gateway.HeaderTimeout, "gateway-header-timeout", g.HeaderTimeout, "longest a gateway client may take to send a request's head (408 after)")
	fs.DurationVar(&o.Gateway.IdleTimeout, "gateway-idle-timeout", g.IdleTimeout, "a gateway tunnel or keep-alive connection with no byte either way for this long is closed (a tunnel within twice this)")
	fs.DurationVar(&o.Gateway.TunnelTimeout, "gateway-tunnel-timeout", g.TunnelTimeout, "longest a gateway tunnel or request lives")
	fs.DurationVar(&o.Gateway.LeaseTTL, "gateway-lease-ttl", g.LeaseTTL, "TTL of a gateway tunnel's lease, renewed every third of it while the tunnel lives (between --min-ttl and --max-ttl): a broker that dies leaves leases that end within it")
	fs.DurationVar(&o.Gateway.DialTimeout, "gateway-dial-timeout", g.DialTimeout, "longest the gateway takes to resolve a destination, and to reach a leased proxy and have its tunnel opened")
	fs.IntVar(&o.Gateway.MaxHeaderBytes, "gateway-max-header-bytes", g.MaxHeaderBytes, "largest request head a gateway client may send (431 past it)")
	fs.StringVar(&o.Gateway.DNS, "gateway-dns", "", "host:port of the DNS server the gateway resolves destinations with; empty means the system's resolver")
	fs.IntVar(&o.Gateway.Retries, "gateway-retries", g.Retries, "how many more proxies a gateway request tries when the leased one fails on its own hop (no answer, credentials refused, its own error) before any byte reached the client, 0-4")
	fs.StringVar(&o.Gateway.TLSAddr, "gateway-tls-addr", "", "address of the gateway served over TLS (an HTTPS proxy: curl --proxy https://, urllib3, Chromium, Node), with --tls-cert-file's certificate; empty means off")
	fs.DurationVar(&o.Gateway.CapacityWait, "gateway-capacity-wait", g.CapacityWait, "how long a gateway request waits for a lease slot when every matching proxy, the target or the token is at its lease cap, before it is refused (0: refused at once)")
	fs.IntVar(&o.Gateway.MaxConns, "gateway-max-conns", g.MaxConns, "most client connections the gateway holds at once, tunnels included; past it a new one is answered 503 GATEWAY_BUSY at once (0: no limit)")
	fs.IntVar(&o.Gateway.MaxConnsPerSource, "gateway-max-conns-per-source", g.MaxConnsPerSource, "most client connections from one address; past it a new one is answered 429 SOURCE_CONN_CAP at once (0: no limit)")
	fs.IntVar(&o.Gateway.TokenMaxTunnels, "gateway-token-max-tunnels", g.TokenMaxTunnels, "most tunnels and requests the callers of one token may have open on each broker's gateway (0: no limit)")
	o.EgressFlags.Register(fs)
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "kubeconfig file; empty means in-cluster config or $KUBECONFIG")
	fs.StringVar(&o.Namespace, "namespace", "", "serve only Proxies of this namespace; empty means all")
	fs.StringVar(&o.SecretNamespaces, "secret-namespaces", "", kube.SecretNamespacesFlag)
	fs.BoolVar(&o.CredentialsSecrets, "credentials-secrets", true, "read the Secrets External proxies name for their credentials (labelled crawl.example.com/proxy-credentials=true, in --secret-namespaces); false reads none, and leases carry only Managed proxies' credentials (--proxy-credentials-key-file)")
	fs.StringVar(&o.RedisAddrs, "redis-addrs", "127.0.0.1:6379", "Redis address; several comma-separated for Cluster, or Sentinels with --redis-master-name")
	fs.StringVar(&o.RedisMaster, "redis-master-name", "", "Sentinel master name (makes --redis-addrs Sentinel addresses)")
	fs.StringVar(&o.RedisPasswordFile, "redis-password-file", "", "file holding the Redis password, re-read when it changes (each new connection uses the current one): a mounted Secret, never a flag or an environment variable")
	fs.StringVar(&o.RedisUsername, "redis-username", "", "Redis ACL user name (with --redis-password-file); empty means the default user")
	fs.StringVar(&o.RedisTLSCAFile, "redis-tls-ca-file", "", "PEM CA bundle Redis's certificate is verified with; set, the broker talks to Redis (and its Sentinels) over TLS")
	fs.StringVar(&o.RedisTLSServer, "redis-tls-server-name", "", "name Redis's certificate must hold; empty means the host of each address")
	fs.StringVar(&o.RedisSentinelPasswordFile, "redis-sentinel-password-file", "", "file holding the Sentinels' password (Sentinel's requirepass), when they ask for one")
	fs.StringVar(&o.RedisSentinelUsername, "redis-sentinel-username", "", "Sentinel ACL user name, with --redis-sentinel-password-file")
	fs.IntVar(&o.RedisDB, "redis-db", 0, "Redis database (not in Cluster mode)")
	fs.StringVar(&o.RedisPrefix, "redis-key-prefix", store.DefaultPrefix, "prefix of every key; it must hold a {hash tag}. Brokers with different prefixes (say, one Deployment per namespace) keep separate state, on different Cluster shards")
	fs.IntVar(&o.RedisWait.Replicas, "redis-wait-replicas", 0, "after each lease change, wait for this many replicas to acknowledge it (Redis WAIT), so a failover cannot lose it; 0 answers at once")
	fs.DurationVar(&o.RedisWait.Timeout, "redis-wait-timeout", 100*time.Millisecond, "longest wait for --redis-wait-replicas; a lease change not acknowledged in time is answered UNAVAILABLE (Redis may hold it: a retry with the same requestId finds it) and counted in proxy_operator_broker_redis_wait_shortfalls_total")
	fs.DurationVar(&o.IndexResync, "index-resync", index.DefaultResync, "how often every selector index is checked against the inventory")
	fs.DurationVar(&o.IndexIdle, "index-idle", index.DefaultIdle, "how long a selector index nobody leases from is kept")
	fs.IntVar(&o.MaxIndexes, "max-indexes", index.DefaultMaxIndexes, "most selector indexes kept at once (distinct namespace and selector pairs in use); the least recently used go first")
	fs.StringVar(&o.GatewayTokenFile, "gateway-token-file", "", "file of gateway-only tokens, lines as in --token-file: each opens gateway tunnels and reports on them, and can neither lease over the API nor list: the password to put in crawlers' proxy URLs (the chart's auth.gatewayToken)")
	fs.StringVar(&o.TokenFile, "token-file", "", "file of bearer tokens, one \"name:token\" per line: each line is a tenant of that name with every namespace and verb (the bootstrap); empty, with no --tenant-namespace, serves unauthenticated")
	fs.StringVar(&o.TenantStatusLease, "tenant-status-lease", "egress-proxies-broker-tenant-status", "Lease in --tenant-namespace whose holder is the one broker that writes the Tenants' status")
	fs.StringVar(&o.TenantNamespace, "tenant-namespace", "", "namespace whose Tenants (credentials in Secrets, namespaces, verbs, quotas) may call; empty: only --token-file's")
	fs.StringVar(&o.TLSCert, "tls-cert-file", "", "PEM certificate the gRPC and REST ports serve (re-read when it changes, so cert-manager can rotate it); empty serves plaintext")
	fs.StringVar(&o.TLSKey, "tls-key-file", "", "PEM key of --tls-cert-file")
	fs.StringVar(&o.CredentialsKeyFile, "proxy-credentials-key-file", "", "the controller's --proxy-credentials-key-file, so leases of Managed proxies carry their credentials")
	fs.DurationVar(&o.Leases.DefaultTTL, "default-ttl", d.DefaultTTL, "lease TTL when a request gives ttlSeconds 0")
	fs.DurationVar(&o.Leases.MinTTL, "min-ttl", d.MinTTL, "shortest lease TTL a request may ask for")
	fs.DurationVar(&o.Leases.MaxTTL, "max-ttl", d.MaxTTL, "longest lease TTL a request may ask for")
	p := leases.DefaultPolicy
	fs.BoolVar(&o.Leases.BanAware, "ban-aware", d.BanAware, "act on outcome reports beyond the seed's fixed cooldown on rate_limited: escalating cooldowns by exit IP, the waterfall guard and pacing, target caps, sticky sessions, quarantine")
	fs.DurationVar(&o.Policy.CooldownBase, "cooldown", p.CooldownBase, "first cooldown a rate_limited or blocked report puts a proxy's exit IP in for that target")
	fs.DurationVar(&o.Policy.CooldownMax, "cooldown-max", p.CooldownMax, "longest cooldown, however often it doubled")
	fs.DurationVar(&o.Policy.CooldownWindow, "cooldown-window", p.CooldownWindow, "how long after a cooldown ends another report doubles the next one (and how long pacing lasts with no report)")
	fs.Float64Var(&o.Policy.MaxCoolingFraction, "max-cooling-fraction", p.MaxCoolingFraction, "largest share of a lease's matching proxies that may cool down for one target; past it the target is paced instead (1: never pace)")
	fs.IntVar(&o.Policy.MaxConcurrentLeases, "target-lease-cap", p.MaxConcurrentLeases, "most live leases for one target across the fleet (0: no cap)")
	fs.Float64Var(&o.Policy.PacingInitial, "pacing-initial", p.PacingInitial, "leases per second a target's pace starts at")
	fs.Float64Var(&o.Policy.PacingMin, "pacing-min", p.PacingMin, "lowest pace, leases per second")
	fs.Float64Var(&o.Policy.PacingMax, "pacing-max", p.PacingMax, "pace at which pacing ends, leases per second")
	fs.IntVar(&o.Leases.Faults.Targets, "quarantine-targets", d.Faults.Targets, "error reports on this many distinct targets within --quarantine-window quarantine a proxy (0: never)")
	fs.DurationVar(&o.Leases.Faults.Window, "quarantine-window", d.Faults.Window, "window of --quarantine-targets")
	fs.DurationVar(&o.Leases.Faults.Period, "quarantine-period", d.Faults.Period, "how long a quarantine lasts unless the proxy turns healthy after it began")
	fs.IntVar(&o.Leases.LeaseCap, "lease-cap", d.LeaseCap, "most live leases per proxy (0: no cap)")
	fs.Int64Var(&o.MaxBody, "max-body-bytes", 64<<10, "largest REST request body")
	fs.BoolVar(&o.Console, "console", true, "serve the read-only web console at /console/ on the REST port (its data comes from the lease API with the viewer's token)")
	fs.Float64Var(&o.Leases.Faults.MaxFraction, "quarantine-max-fraction", d.Faults.MaxFraction, "largest share of a selector's proxies quarantined at once; past it quarantine holds (action QUARANTINE_HELD, alert EgressProxiesQuarantineHeld) and leasing goes on, as MachineHealthCheck's maxUnhealthy (1: no limit)")
	fs.IntVar(&o.Leases.TokenMaxLeases, "token-max-leases", d.TokenMaxLeases, "most live leases one tenant holds, fleet-wide (0: no cap); a Tenant's spec.quotas.maxLeases overrides it")
	fs.Float64Var(&o.Leases.TokenReportRate, "token-report-rate", d.TokenReportRate, "outcome reports per second one tenant may send to each broker (0: no limit); a Tenant's spec.quotas.reportsPerSecond overrides it")
	fs.DurationVar(&o.Leases.WatchSendTimeout, "watch-send-timeout", d.WatchSendTimeout, "a WatchProxies stream (gRPC and REST) whose client takes no batch within this long is ended; quiet gaps between batches are not timed")
	fs.IntVar(&o.Leases.TokenMaxWatches, "token-max-watches", d.TokenMaxWatches, "most WatchProxies streams (gRPC and REST) one tenant may hold open on each broker (0: no cap); a Tenant's spec.quotas.maxWatches overrides it")
	fs.IntVar(&o.Leases.TokenReportBurst, "token-report-burst", d.TokenReportBurst, "reports one tenant may send at once, above --token-report-rate")
	fs.IntVar(&o.Leases.TokenMaxSelectors, "token-max-selectors", d.TokenMaxSelectors, "most distinct selectors one tenant leases with on each broker within --index-idle; a lease on a new one past it is refused, so one tenant cannot evict everyone's indexes (0: no cap); a Tenant's spec.quotas.maxSelectors overrides it")
}

var hashTag = regexp.MustCompile(`\{[^{}]+\}`)

// Validate names the first bad flag.
func (o *Options) Validate() error {
	l := o.Leases
	switch {
	case l.MinTTL <= 0 || l.MaxTTL < l.MinTTL:
		return errors.New("--min-ttl must be positive and not above --max-ttl")
	case l.DefaultTTL < l.MinTTL || l.DefaultTTL > l.MaxTTL:
		return fmt.Errorf("--default-ttl %s must be between --min-ttl %s and --max-ttl %s", l.DefaultTTL, l.MinTTL, l.MaxTTL)
	case o.Policy.CooldownBase < time.Second || o.Policy.CooldownMax < o.Policy.CooldownBase || o.Policy.CooldownWindow < time.Second:
		return errors.New("--cooldown and --cooldown-window must be at least 1s, and --cooldown-max not below --cooldown")
	case o.Policy.MaxCoolingFraction <= 0 || o.Policy.MaxCoolingFraction > 1:
		return fmt.Errorf("--max-cooling-fraction %g must be above 0 and at most 1", o.Policy.MaxCoolingFraction)
	case o.Policy.MaxConcurrentLeases < 0:
		return errors.New("--target-lease-cap must not be negative")
	case o.Policy.PacingMin <= 0 || o.Policy.PacingMin > o.Policy.PacingInitial || o.Policy.PacingInitial > o.Policy.PacingMax:
		return fmt.Errorf("--pacing-min %g, --pacing-initial %g and --pacing-max %g must be positive and in that order", o.Policy.PacingMin, o.Policy.PacingInitial, o.Policy.PacingMax)
	case l.Faults.Targets < 0 || l.Faults.Window <= 0 || l.Faults.Period <= 0:
		return errors.New("--quarantine-targets must not be negative, --quarantine-window and --quarantine-period positive")
	case l.LeaseCap < 0:
		return errors.New("--lease-cap must not be negative")
	case l.Faults.MaxFraction <= 0 || l.Faults.MaxFraction > 1:
		return fmt.Errorf("--quarantine-max-fraction %g must be above 0 and at most 1", l.Faults.MaxFraction)
	case l.TokenMaxLeases < 0 || l.TokenReportRate < 0 || l.TokenReportBurst < 0 || l.TokenMaxWatches < 0 || l.TokenMaxSelectors < 0:
		return errors.New("--token-max-leases, --token-report-rate, --token-report-burst, --token-max-watches and --token-max-selectors must not be negative")
	case o.TenantNamespace != "" && len(validation.IsDNS1123Label(o.TenantNamespace)) > 0:
		return fmt.Errorf("--tenant-namespace %q is not a namespace name", o.TenantNamespace)
	case o.TenantNamespace != "" && len(validation.IsDNS1123Subdomain(o.TenantStatusLease)) > 0:
		return fmt.Errorf("--tenant-status-lease %q is not a Lease name: %s", o.TenantStatusLease, strings.Join(validation.IsDNS1123Subdomain(o.TenantStatusLease), "; "))
	case o.RedisUsername != "" && o.RedisPasswordFile == "":
		return errors.New("--redis-username needs --redis-password-file")
	case o.RedisSentinelUsername != "" && o.RedisSentinelPasswordFile == "":
		return errors.New("--redis-sentinel-username needs --redis-sentinel-password-file")
	case o.MaxBody <= 0:
		return errors.New("--max-body-bytes must be positive")
	case !hashTag.MatchString(o.RedisPrefix):
		return fmt.Errorf("--redis-key-prefix %q must hold a non-empty {hash tag}, so each script's keys share one Cluster slot", o.RedisPrefix)
	case o.RedisWait.Replicas < 0 || o.RedisWait.Timeout <= 0:
		return errors.New("--redis-wait-replicas must not be negative and --redis-wait-timeout must be positive")
	case (o.TLSCert == "") != (o.TLSKey == ""):
		return errors.New("--tls-cert-file and --tls-key-file go together")
	case o.IndexResync <= 0 || o.IndexIdle <= 0 || o.MaxIndexes < 1:
		return errors.New("--index-resync and --index-idle must be positive and --max-indexes at least 1")
	}
	if err := o.Limits.Validate(); err != nil {
		return err
	}
	if o.Gateway.Addr != "" {
		if err := o.Gateway.Validate(); err != nil {
			return err
		}
		if t := o.Gateway.LeaseTTL; t < l.MinTTL || t > l.MaxTTL {
			return fmt.Errorf("--gateway-lease-ttl %s must be between --min-ttl %s and --max-ttl %s", t, l.MinTTL, l.MaxTTL)
		}
		if o.TokenFile == "" && o.TenantNamespace == "" {
			return gateway.ErrOpenProxy
		}
		if o.Gateway.TLSAddr != "" && o.TLSCert == "" {
			return gateway.ErrNoCertificate
		}
	}
	var egressErr error
	if o.Gateway.Egress, egressErr = o.EgressFlags.Parse(); egressErr != nil {
		return egressErr
	}
	var err error
	if o.secretNamespaces, err = kube.ParseNamespaces(o.SecretNamespaces); err != nil {
		return fmt.Errorf("--secret-namespaces: %w", err)
	}
	if o.credentialsKey, err = proxyauth.LoadKey(o.CredentialsKeyFile); err != nil {
		return fmt.Errorf("--proxy-credentials-key-file: %w", err)
	}
	return nil
}
