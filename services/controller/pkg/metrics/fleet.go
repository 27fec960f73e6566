package metrics

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

var proxiesDesc = prometheus.NewDesc("proxy_operator_proxies",
	"Proxies by their namespace (proxy_namespace: Prometheus gives namespace to the scraped pod), phase and health (the Healthy condition's status: true, false, unknown). Only the elected controller reports it, so the fleet is counted once.",
	[]string{"proxy_namespace", "phase", "healthy"}, nil)

// FleetCollector counts the Proxies in the manager's cache at each scrape:
// a walk of the cache, no API call, and nothing kept between scrapes. A
// replica that does not lead reports nothing, so summing over replicas
// does not double the fleet.
func FleetCollector(cache client.Reader, elected <-chan struct{}) prometheus.Collector {
	return fleet{cache: cache, elected: elected}
}

type fleet struct {
	cache   client.Reader
	elected <-chan struct{}
}

func (f fleet) Describe(ch chan<- *prometheus.Desc) { ch <- proxiesDesc }

func (f fleet) Collect(ch chan<- prometheus.Metric) {
	select {
	case <-f.elected:
	default:
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Read-only: the cache's own objects, not a copy of the fleet per scrape.
	var list v1.ProxyList
	if err := f.cache.List(ctx, &list, client.UnsafeDisableDeepCopy); err != nil {
		return
	}
	type key struct{ ns, phase, healthy string }
	counts := map[key]int{}
	for i := range list.Items {
		px := &list.Items[i]
		healthy := "unknown"
		if c := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy); c != nil {
			healthy = strings.ToLower(string(c.Status))
		}
		phase := string(px.Status.Phase)
		if phase == "" {
			phase = string(v1.PhasePending)
		}
		counts[key{px.Namespace, phase, healthy}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(proxiesDesc, prometheus.GaugeValue, float64(n), k.ns, k.phase, k.healthy)
	}
}
