package proxypool

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

var (
	decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "proxy_operator_pool_decisions_total",
		Help: "Members ProxyPools created, drained and deleted, by action and cause (failed, outdated, max-age, scale-down, drained, drain-timeout, missing, replacement); counted once the write is made.",
	}, []string{"action", "cause"})
	remediationPaused = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_pool_remediation_paused",
		Help: "1 while a pool's remediation is paused (more members unhealthy than maxUnhealthy), else 0.",
	}, []string{"namespace", "pool"})
	drainsInFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "proxy_operator_pool_drains_in_flight",
		Help: "Members of each pool that drain: marked, not yet deleted.",
	}, []string{"namespace", "pool"})
)

// Collectors are the package's metrics; the controller registers them.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{decisions, remediationPaused, drainsInFlight}
}

// counted counts a decision whose write succeeded, and passes err on.
func counted(a Action, c Cause, err error) error {
	if err == nil {
		decisions.WithLabelValues(string(a), string(c)).Inc()
	}
	return err
}

// gauge sets the pool's gauges from what one reconcile observed and
// decided.
func gauge(pool *v1.ProxyPool, draining int, paused bool) {
	p := 0.0
	if paused {
		p = 1
	}
	remediationPaused.WithLabelValues(pool.Namespace, pool.Name).Set(p)
	drainsInFlight.WithLabelValues(pool.Namespace, pool.Name).Set(float64(draining))
}

// forgetGauges drops a deleted pool's series.
func forgetGauges(key types.NamespacedName) {
	remediationPaused.DeleteLabelValues(key.Namespace, key.Name)
	drainsInFlight.DeleteLabelValues(key.Namespace, key.Name)
}
