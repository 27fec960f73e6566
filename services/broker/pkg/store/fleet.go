package store

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

var (
	liveLeasesDesc = prometheus.NewDesc("proxy_operator_broker_live_leases",
		"Live leases in the shared store, by the leased proxy's namespace (proxy_namespace): fleet-wide, so every broker replica reports the same (aggregate with max, not sum).",
		[]string{"proxy_namespace"}, nil)
	cooldownsDesc = prometheus.NewDesc("proxy_operator_broker_cooldowns",
		"Proxy and target pairs cooling down after a rate_limited or blocked report, fleet-wide (aggregate with max).", nil, nil)
	quarantinesDesc = prometheus.NewDesc("proxy_operator_broker_quarantined_proxies",
		"Proxies quarantined after error reports on several targets, fleet-wide (aggregate with max).", nil, nil)
	pacedDesc = prometheus.NewDesc("proxy_operator_broker_target_pace_rate",
		"Leases per second a paced target is held to, fleet-wide, one series per paced target (aggregate with max).", []string{"target"}, nil)
	tenantLeasesDesc = prometheus.NewDesc("proxy_operator_broker_tenant_live_leases",
		"Live leases by the tenant holding them, fleet-wide: what its maxLeases quota counts (aggregate with max).", []string{"tenant"}, nil)
	redisUpDesc = prometheus.NewDesc("proxy_operator_broker_redis_up",
		"1 when this broker's scrape-time read of Redis succeeded, else 0 (it cannot lease then).", nil, nil)
)

// Fleet is the counts the fleet gauges report, read from the store at once.
type Fleet struct {
	// Leases counts live leases by their proxy's namespace.
	Leases map[string]int64
	// Cooldowns counts proxy and target pairs cooling down.
	Cooldowns int64
	// Quarantines counts quarantined proxies.
	Quarantines int64
	// Paced maps each paced target to its rate, leases/s.
	Paced map[string]float64
	// TenantLeases counts live leases by the tenant holding them.
	TenantLeases map[string]int64
}

// TenantLeases reads the live leases of each tenant holding any.
func (s *Store) TenantLeases(ctx context.Context) (map[string]int64, error) {
	m, err := s.rdb.HGetAll(ctx, s.key(KeyTokens)).Result()
	if err != nil {
		return nil, wrap(err)
	}
	return tenantLeases(m), nil
}

// seenKeep is how long a tenant's last call is kept once it stops calling.
const seenKeep = 30 * 24 * time.Hour

// Seen records when this broker last served each tenant, keeping the
// later of each and every other broker's, and forgets tenants that have
// not called for 30 days.
func (s *Store) Seen(ctx context.Context, seen map[string]time.Time, now time.Time) error {
	k := s.key(KeyTenantSeen)
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		if len(seen) > 0 {
			zs := make([]redis.Z, 0, len(seen))
			for name, at := range seen {
				zs = append(zs, redis.Z{Member: name, Score: float64(at.Unix())})
			}
			p.ZAddGT(ctx, k, zs...)
		}
		p.ZRemRangeByScore(ctx, k, "-inf", strconv.FormatInt(now.Add(-seenKeep).Unix(), 10))
		return nil
	})
	return wrap(err)
}

// LastSeen is when any broker last served each tenant.
func (s *Store) LastSeen(ctx context.Context) (map[string]time.Time, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.key(KeyTenantSeen), 0, -1).Result()
	if err != nil {
		return nil, wrap(err)
	}
	out := make(map[string]time.Time, len(zs))
	for _, z := range zs {
		if name, ok := z.Member.(string); ok {
			out[name] = time.Unix(int64(z.Score), 0)
		}
	}
	return out, nil
}

// tenantLeases parses the Tokens hash: the tenants holding a live lease.
func tenantLeases(m map[string]string) map[string]int64 {
	out := make(map[string]int64, len(m))
	for name, v := range m {
		if n, _ := strconv.ParseInt(v, 10, 64); n > 0 {
			out[name] = n
		}
	}
	return out
}

// day is t's UTC day, as the per-day keys name it.
func day(t time.Time) string { return t.UTC().Format("2006-01-02") }

// AddTenantBytes counts n bytes the tenant's gateway tunnels carried now,
// and returns its count for the day.
func (s *Store) AddTenantBytes(ctx context.Context, tenant string, n int64, now time.Time) (int64, error) {
	k := s.key(KeyTenantBytes, tenant, day(now))
	var total *redis.IntCmd
	if _, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		total = p.IncrBy(ctx, k, n)
		p.Expire(ctx, k, 48*time.Hour)
		return nil
	}); err != nil {
		return 0, wrap(err)
	}
	return total.Val(), nil
}

// TenantBytes is what the tenant's gateway tunnels carried on now's UTC
// day.
func (s *Store) TenantBytes(ctx context.Context, tenant string, now time.Time) (int64, error) {
	n, err := s.rdb.Get(ctx, s.key(KeyTenantBytes, tenant, day(now))).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, wrap(err)
}

// Fleet reads the live lease counts (the high half of each proxy's score),
// the quarantines, the paced targets and the cooldowns (what is due that
// is neither a lease nor a quarantine) in one round trip: a read of the
// score and namespace hashes, O(proxies), at scrape time rather than a
// counter every script must keep. A pace that lapsed (no report for a
// window) is left out, though only a lease or report for its target
// clears it.
func (s *Store) Fleet(ctx context.Context) (Fleet, error) {
	var scores, namespaces, paced, tenants *redis.MapStringStringCmd
	var due, quarantines *redis.IntCmd
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		scores = p.HGetAll(ctx, s.key(KeyScore))
		namespaces = p.HGetAll(ctx, s.key(KeyNamespace))
		due = p.ZCard(ctx, s.key(KeyDue))
		quarantines = p.HLen(ctx, s.key(KeyQuarantine))
		paced = p.HGetAll(ctx, s.key(KeyPaced))
		tenants = p.HGetAll(ctx, s.key(KeyTokens))
		return nil
	}); err != nil {
		return Fleet{}, wrap(err)
	}
	f := Fleet{Leases: map[string]int64{}, Quarantines: quarantines.Val(), Paced: map[string]float64{}, TenantLeases: tenantLeases(tenants.Val())}
	if err := s.livePaces(ctx, paced.Val(), f.Paced); err != nil {
		return Fleet{}, err
	}
	var total int64
	ns := namespaces.Val()
	for uid, v := range scores.Val() {
		score, _ := strconv.ParseFloat(v, 64)
		n := int64(score) >> 32
		if n > 0 {
			f.Leases[ns[uid]] += n
			total += n
		}
	}
	f.Cooldowns = max(due.Val()-total-f.Quarantines, 0)
	return f, nil
}

// FleetCollector reports Fleet on each scrape, and whether Redis answered.
// While Redis is unreachable it reports redis_up 0 and no counts, so the
// rest of /metrics still scrapes.
func FleetCollector(s *Store) prometheus.Collector { return fleetCollector{s} }

type fleetCollector struct{ s *Store }

func (c fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- liveLeasesDesc
	ch <- cooldownsDesc
	ch <- redisUpDesc
	ch <- quarantinesDesc
	ch <- pacedDesc
	ch <- tenantLeasesDesc
}

func (c fleetCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	f, err := c.s.Fleet(ctx)
	if err != nil {
		ch <- prometheus.MustNewConstMetric(redisUpDesc, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(redisUpDesc, prometheus.GaugeValue, 1)
	for ns, n := range f.Leases {
		ch <- prometheus.MustNewConstMetric(liveLeasesDesc, prometheus.GaugeValue, float64(n), ns)
	}
	for name, n := range f.TenantLeases {
		ch <- prometheus.MustNewConstMetric(tenantLeasesDesc, prometheus.GaugeValue, float64(n), name)
	}
	ch <- prometheus.MustNewConstMetric(cooldownsDesc, prometheus.GaugeValue, float64(f.Cooldowns))
	ch <- prometheus.MustNewConstMetric(quarantinesDesc, prometheus.GaugeValue, float64(f.Quarantines))
	for t, r := range f.Paced {
		ch <- prometheus.MustNewConstMetric(pacedDesc, prometheus.GaugeValue, r, t)
	}
}

// livePaces copies the paces that have not lapsed, as Redis's clock says,
// from rates (target -> rate) into out.
func (s *Store) livePaces(ctx context.Context, rates map[string]string, out map[string]float64) error {
	if len(rates) == 0 {
		return nil
	}
	var now *redis.TimeCmd
	until := map[string]*redis.StringCmd{}
	if _, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		for t := range rates {
			until[t] = p.HGet(ctx, s.key(KeyTarget, t), "until")
		}
		return nil
	}); err != nil && !errors.Is(err, redis.Nil) {
		return wrap(err)
	}
	for t, v := range rates {
		if ms, err := until[t].Int64(); err == nil && ms > now.Val().UnixMilli() {
			out[t], _ = strconv.ParseFloat(v, 64)
		}
	}
	return nil
}
