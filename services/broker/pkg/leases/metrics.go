package leases

import "github.com/prometheus/client_golang/prometheus"

var (
	leasesCreated  = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_leases_created_total", Help: "Leases granted."})
	leasesRenewed  = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_leases_renewed_total", Help: "Leases renewed."})
	leasesReleased = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_leases_released_total", Help: "Live leases released (releases of unknown leases are not counted). Leases that expire instead are created minus released."})
	reports        = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_reports_total", Help: "Reports by result."}, []string{"result"})
	noCandidate    = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_no_candidate_total", Help: "CreateLease answers with no proxy available, by reason."}, []string{"reason"})
	renewRefused   = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_renew_refused_total", Help: "RenewLease answers refusing a live lease because its proxy left the leasable set, by reason."}, []string{"reason"})
	// refusalsUncounted: refusals ListRefusals misses (Redis failed to
	// count them), so pools with autoscaling saw less demand than there was.
	refusalsUncounted = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_refusals_uncounted_total", Help: "Refused leases that could not be counted for ListRefusals."})
)

// Collectors are the service's metrics, for the binary's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{leasesCreated, leasesRenewed, leasesReleased, reports, noCandidate, renewRefused, refusalsUncounted}
}
