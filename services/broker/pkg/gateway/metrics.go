package gateway

import "github.com/prometheus/client_golang/prometheus"

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_requests_total",
		Help: "Gateway requests by kind (connect, http; unread: no request could be read) and the HTTP status the client got."}, []string{"kind", "code"})
	tunnelsOpen = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_broker_gateway_tunnels",
		Help: "CONNECT tunnels open through the gateway."})
	tunnelBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_tunnel_bytes_total",
		Help: "Bytes through closed tunnels: sent (client to proxy) and received."}, []string{"direction"})
	outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_reports_total",
		Help: "Outcomes the gateway reported on its leases, by kind and result."}, []string{"kind", "result"})
	egressDenied = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_egress_denied_total",
		Help: "Requests refused because their destination resolved outside the egress policy."})
	tokenCapped = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_token_capped_total",
		Help: "Requests refused because their token held its --gateway-token-max-tunnels, by token name."}, []string{"token"})
	releaseFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_release_failures_total",
		Help: "Leases the gateway could not release (they expire at their TTL, --gateway-tunnel-timeout)."})
	renewals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_renewals_total",
		Help: "Renewals of tunnels' leases: renewed, ended (the lease was gone or its proxy no longer leasable: the tunnel was closed), revoked (its token no longer valid: the tunnel was closed), failed (retried next round) or deferred (the round ran out of its time: first in the next)."}, []string{"result"})
	retries = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_retries_total",
		Help: "Requests the gateway sent through another proxy because the leased one failed on its own hop before any byte reached the client (--gateway-retries)."})
	connsOpen = prometheus.NewGauge(prometheus.GaugeOpts{Name: "proxy_operator_broker_gateway_connections",
		Help: "Client connections open to the gateway, tunnels included (--gateway-max-conns bounds them)."})
	connsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_connections_refused_total",
		Help: "Client connections refused on accept: the gateway held --gateway-max-conns, or their source address --gateway-max-conns-per-source."}, []string{"bound"})
	tlsFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_tls_handshake_failures_total",
		Help: "Connections to --gateway-tls-addr that ended in their TLS handshake."})
	tunnelEnds = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_tunnel_ends_total",
		Help: "Tunnels the gateway ended itself, by why: idle (no byte either way), stalled (a side stopped reading: a write waited an idle timeout), deadline (--gateway-tunnel-timeout), lease (it could not be renewed: the proxy left, or the token was revoked), quota (its tenant passed spec.quotas.gatewayBytesPerDay while it flowed), shutdown."}, []string{"why"})
	renewRounds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "proxy_operator_broker_gateway_renewal_round_seconds",
		Help: "How long each round renewing the due leases of live tunnels took; bounded by a third of --gateway-lease-ttl.", Buckets: prometheus.ExponentialBuckets(0.001, 4, 9)})
	capacityWaits = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_capacity_waits_total",
		Help: "Requests that found every lease slot taken and waited (--gateway-capacity-wait), by how the wait ended: leased or refused."}, []string{"outcome"})
	reportFailed = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_gateway_report_failures_total",
		Help: "Outcome reports the gateway could not make."})
)

// Collectors are the gateway's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{requests, tunnelsOpen, tunnelBytes, outcomes, egressDenied, tokenCapped, releaseFailed, reportFailed, renewals, retries, connsOpen, connsRefused, tlsFailed, tunnelEnds, renewRounds, capacityWaits}
}
