package index

import "github.com/prometheus/client_golang/prometheus"

var (
	indexesBuilt   = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_selector_indexes_built_total", Help: "Selector indexes this broker built (the first lease request for a selector)."})
	indexesDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_selector_indexes_dropped_total", Help: "Selector indexes this broker dropped as idle or over the limit."})
	indexRepairs   = prometheus.NewCounter(prometheus.CounterOpts{Name: "proxy_operator_broker_selector_index_repairs_total", Help: "Index memberships a resync found wrong and fixed; steadily rising means brokers disagree about the fleet."})
)

// Collectors are the package's metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{indexesBuilt, indexesDropped, indexRepairs}
}
