package access

import (
	"sync"

	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"
)

// MaxLabels bounds the tenant names metrics carry: tenants are the
// operator's, so only a mistake (thousands of token-file lines) reaches
// it, and the names past it are counted as "other".
const MaxLabels = 500

var labels = struct {
	sync.RWMutex
	seen map[string]bool
}{seen: map[string]bool{}}

// Label is name as a metric label: itself for the first MaxLabels names
// seen, "other" after; "" (no credentials configured) is "none".
func Label(name string) string {
	if name == "" {
		return "none"
	}
	labels.RLock()
	ok := labels.seen[name]
	labels.RUnlock()
	if ok {
		return name
	}
	labels.Lock()
	defer labels.Unlock()
	if len(labels.seen) >= MaxLabels && !labels.seen[name] {
		return "other"
	}
	labels.seen[name] = true
	return name
}

// Usage per tenant: what each did, and what it was refused.
var (
	Calls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_calls_by_token_total",
		Help: "Lease API calls by the name of the token they were authenticated with, method and code: gRPC, REST and the proxy gateway's."}, []string{"token", "method", "code"})
	Refusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_tenant_refusals_total",
		Help: "Calls refused, by tenant and reason (the ErrorInfo reason, else the gRPC code): its quotas (TOKEN_LEASE_CAP, TENANT_LEASE_RATE...), its scope (TENANT_NAMESPACE, TENANT_VERB...), the fleet's (NO_MATCHING_PROXY, ALL_COOLING_DOWN...)."}, []string{"tenant", "reason"})
	Outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_tenant_outcomes_total",
		Help: "Outcome reports accepted, by tenant and result; the gateway's own included."}, []string{"tenant", "result"})
	Tunnels = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "proxy_operator_broker_tenant_gateway_tunnels",
		Help: "Gateway tunnels and requests in flight on this broker, by tenant."}, []string{"tenant"})
	GatewayBytes = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "proxy_operator_broker_tenant_gateway_bytes_total",
		Help: "Bytes through the gateway's closed tunnels and requests, by tenant and direction (sent: client to site)."}, []string{"tenant", "direction"})
)

// Collectors are the per-tenant metrics.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{Calls, Refusals, Outcomes, Tunnels, GatewayBytes}
}

// Called counts a call c made of method (a LeaseService method's name)
// that ended in err: under its tenant's name (names are the operator's,
// one per token-file line or Tenant, so the label's values are few), and
// a refusal by its reason (the ErrorInfo's, else the gRPC code). Every
// transport counts its calls here.
func Called(c Caller, method string, err error) {
	st := status.Convert(err)
	if c.Name != "" {
		Calls.WithLabelValues(c.Name, method, st.Code().String()).Inc()
	}
	if err == nil {
		return
	}
	reason, _ := leaseclient.Details(st)
	if reason == "" {
		reason = st.Code().String()
	}
	Refusals.WithLabelValues(Label(c.Name), reason).Inc()
}
