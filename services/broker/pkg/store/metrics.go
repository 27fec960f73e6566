package store

import "github.com/prometheus/client_golang/prometheus"

var waitShortfalls = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "proxy_operator_broker_redis_wait_shortfalls_total",
	Help: "Lease changes that fewer replicas than --redis-wait-replicas acknowledged within --redis-wait-timeout: answered as unavailable, since a failover could lose them.",
})

// Collectors are the package's metrics.
func Collectors() []prometheus.Collector { return []prometheus.Collector{waitShortfalls} }
