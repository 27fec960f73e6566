// Package metrics holds the controller's Prometheus metrics that more than
// one controller records, registered with controller-runtime's registry
// (served on the manager's /metrics).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// StatusWrites counts Proxy status writes by writer; a steady fleet keeps
// it flat, because writes are transition-only.
var StatusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "proxy_operator_status_writes_total",
	Help: "Proxy status writes by writer (lifecycle, health).",
}, []string{"writer"})

// Collectors are the package's metrics; the controller registers them.
func Collectors() []prometheus.Collector { return []prometheus.Collector{StatusWrites} }
