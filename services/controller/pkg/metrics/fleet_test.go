package metrics_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestFleetGaugeCountsByNamespacePhaseAndHealth(t *testing.T) {
	testenv.Require(t)
	a, b := env.Namespace(t, "fleet-a"), env.Namespace(t, "fleet-b")
	env.ReadyProxy(t, a, "h1", "127.0.0.1", 3128, nil, true)
	env.ReadyProxy(t, a, "h2", "127.0.0.2", 3128, nil, true)
	env.ReadyProxy(t, a, "n1", "127.0.0.3", 3128, nil, false)
	env.ReadyProxy(t, b, "h1", "127.0.0.4", 3128, nil, true)
	require.NoError(t, env.Client.Create(t.Context(), &v1.Proxy{
		ObjectMeta: objectMeta(b, "fresh"), Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "kubernetes"}}))

	// Scoped to the two namespaces: other tests share the API server.
	scoped := scopedReader{env.Client, map[string]bool{a: true, b: true}}
	follower := metrics.FleetCollector(scoped, make(chan struct{}))
	n, err := testutil.GatherAndCount(registry(t, follower))
	require.NoError(t, err)
	assert.Zero(t, n, "a replica that does not lead reports nothing")

	elected := make(chan struct{})
	close(elected)
	want := `# HELP proxy_operator_proxies Proxies by their namespace (proxy_namespace: Prometheus gives namespace to the scraped pod), phase and health (the Healthy condition's status: true, false, unknown). Only the elected controller reports it, so the fleet is counted once.
# TYPE proxy_operator_proxies gauge
proxy_operator_proxies{healthy="true",phase="Ready",proxy_namespace="` + a + `"} 2
proxy_operator_proxies{healthy="unknown",phase="Ready",proxy_namespace="` + a + `"} 1
proxy_operator_proxies{healthy="true",phase="Ready",proxy_namespace="` + b + `"} 1
proxy_operator_proxies{healthy="unknown",phase="Pending",proxy_namespace="` + b + `"} 1
`
	assert.NoError(t, testutil.GatherAndCompare(registry(t, metrics.FleetCollector(scoped, elected)), strings.NewReader(want)))
}

func objectMeta(ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name}
}

func registry(t *testing.T, c prometheus.Collector) *prometheus.Registry {
	t.Helper()
	r := prometheus.NewPedanticRegistry()
	require.NoError(t, r.Register(c))
	return r
}

// scopedReader lists only the Proxies of some namespaces.
type scopedReader struct {
	client.Reader
	namespaces map[string]bool
}

func (s scopedReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if err := s.Reader.List(ctx, list, opts...); err != nil {
		return err
	}
	pl := list.(*v1.ProxyList)
	kept := pl.Items[:0]
	for _, px := range pl.Items {
		if s.namespaces[px.Namespace] {
			kept = append(kept, px)
		}
	}
	pl.Items = kept
	return nil
}
