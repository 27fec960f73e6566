package leases

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

var (
	leasesCreated  = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_leases_created_total", Help: "Leases granted."})
	leasesRenewed  = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_leases_renewed_total", Help: "Leases renewed."})
	leasesReleased = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_leases_released_total", Help: "Live leases released (releases of unknown leases are not counted). Leases that expire instead are created minus released."})
	reports        = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_reports_total", Help: "Outcome reports by result and the target's status code class (2xx..5xx, none)."}, []string{"result", "status_class"})
	reportActions  = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_report_actions_total", Help: "What outcome reports made the broker do (COOLDOWN_STARTED, GUARD_HELD, PACE_CUT, QUARANTINED...), by action."}, []string{"action"})
	reportLatency  = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "proxy_operator_broker_report_latency_seconds", Help: "Request latency crawlers reported (latencyMs), by result.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 10)}, []string{"result"})
	noCandidate  = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_no_candidate_total", Help: "CreateLease answers with no proxy available, by reason."}, []string{"reason"})
	renewRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_renew_refused_total", Help: "RenewLease answers refusing a live lease because its proxy left the leasable set, by reason."}, []string{"reason"})
	// refusalsUncounted: refusals ListRefusals misses (Redis failed to
	// count them), so pools with autoscaling saw less demand than there was.
	refusalsUncounted = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_refusals_uncounted_total", Help: "Refused leases that could not be counted for ListRefusals."})
	tokenLimited      = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_token_limited_total", Help: "Calls refused because their token was over a limit (leases: --token-max-leases, reports: --token-report-rate, watches: --token-max-watches), by token name."}, []string{"token", "limit"})
	storeFull         = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_store_full_total", Help: "Calls refused because Redis was at its maxmemory."})
)

// Collectors are the service's metrics, for the binary's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{leasesCreated, leasesRenewed, leasesReleased, reports, reportActions, reportLatency, noCandidate, renewRefused, refusalsUncounted, tokenLimited, storeFull,
		watchers, watchesEnded}
}

func observeReport(o store.Outcome, statusCode, latencyMs int32, actions []string) {
	class := "none"
	if statusCode > 0 {
		class = strconv.Itoa(int(statusCode/100)) + "xx"
	}
	reports.WithLabelValues(string(o), class).Inc()
	if latencyMs > 0 {
		reportLatency.WithLabelValues(string(o)).Observe(float64(latencyMs) / 1000)
	}
	for _, a := range actions {
		reportActions.WithLabelValues(a).Inc()
	}
}

var (
	watchers = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_broker_watches",
		Help: "WatchProxies streams open."})
	watchesEnded = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_watches_ended_total",
		Help: "WatchProxies streams the broker ended, by why: behind (WatchBacklog batches of changes unsent), stalled (a batch not taken within --watch-send-timeout: the watcher stopped reading), unauthorized (its credential was removed or its tenant's scope changed)."}, []string{"why"})
)
