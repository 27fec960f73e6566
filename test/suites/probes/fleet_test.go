package probes

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/tlstarget"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const (
	controllerPkg = "github.com/egress-proxies/egress-proxies/services/controller/cmd/controller"
	proberPkg     = "github.com/egress-proxies/egress-proxies/services/prober/cmd/prober"
	interval      = time.Second
)

func external(t *testing.T, ns, name, addr string, hc *v1.HealthCheck) {
	t.Helper()
	host, portS, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portS)
	require.NoError(t, env.Client.Create(context.Background(), &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1.ProxySpec{Mode: v1.ModeExternal, Address: host, Port: int32(port), HealthCheck: hc},
	}))
}

func get(t *testing.T, ns, name string) *v1.Proxy {
	px := &v1.Proxy{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, px))
	return px
}

func waitHealth(t *testing.T, ns, name string, want metav1.ConditionStatus, msg ...string) *v1.Proxy {
	t.Helper()
	var last *v1.Proxy
	require.Eventually(t, func() bool {
		last = get(t, ns, name)
		c := meta.FindStatusCondition(last.Status.Conditions, v1.ConditionHealthy)
		if c == nil || c.Status != want {
			return false
		}
		for _, m := range msg {
			if !strings.Contains(c.Message, m) {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "%s never became Healthy=%s %v; last conditions %+v", name, want, msg, func() any {
		if last == nil {
			return nil
		}
		return last.Status.Conditions
	}())
	return last
}

// scrape reads a process's /metrics.
func scrape(t *testing.T, url string) promtext.Samples {
	t.Helper()
	m, err := promtext.Scrape(nil, url)
	require.NoError(t, err)
	return m
}

var lastProbeRe = regexp.MustCompile(`^proxy_operator_healthcheck_last_timestamp_seconds\{name="([^"]+)",namespace="([^"]+)"\}$`)

func lastProbes(m promtext.Samples, ns string) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if g := lastProbeRe.FindStringSubmatch(k); g != nil && g[2] == ns {
			out[g[1]] = v
		}
	}
	return out
}

func TestProbeFleetEndToEnd(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "fleet")
	// The controller watches every namespace: a later run (-count) must
	// not find this one's proxies, whose Squids are gone.
	t.Cleanup(func() {
		_ = env.Client.DeleteAllOf(context.Background(), &v1.Proxy{}, client.InNamespace(ns))
	})

	target := tlstarget.StartT(t)
	caFile := target.CAFile
	stranger := tlstarget.StartT(t) // its CA is not given to the probers
	good := proc.StartSquid(t, "127.0.0.1", false)
	spare := proc.StartSquid(t, "127.0.0.1", false)
	denying := proc.StartSquid(t, "127.0.0.1", true)
	silent := proc.SilentListener(t) // TCP up, no egress
	kc, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	probeAddr, metrics := proc.Addr(proc.FreePort(t)), proc.FreePort(t)
	probeCA, err := certs.NewCA("probe CA")
	require.NoError(t, err)
	probeTLS, err := probeCA.WriteServer(t.TempDir(), "127.0.0.1")
	require.NoError(t, err)
	ctrlArgs := []string{"--kubeconfig", kc, "--leader-election-namespace", "default", "--leader-election-lease-duration", "5s",
		"--metrics-bind-address", proc.Addr(metrics), "--health-probe-bind-address", proc.Addr(proc.FreePort(t)),
		"--probe-addr", probeAddr, "--probe-tls-cert-file", probeTLS.Cert, "--probe-tls-key-file", probeTLS.Key, "--health-url", target.URL + "/ip", "--health-expected-status", "200",
		"--health-echo-format", "text", "--health-interval", interval.String(), "--health-timeout", "750ms",
		"--health-failure-threshold", "3", "--health-success-threshold", "2", "--egress-allowance-cidrs", proc.SuiteAllowance}
	ctrl := proc.Start(t, "controller", proc.Build(t, controllerPkg), ctrlArgs...)
	metricsURL := "http://" + proc.Addr(metrics) + "/metrics"
	proc.WaitHTTP(t, ctrl, metricsURL, 60*time.Second)

	var probers []*proc.Process
	for i := range 3 {
		ops := proc.FreePort(t)
		p := proc.Start(t, fmt.Sprintf("prober-%d", i), proc.Build(t, proberPkg), "--controller-addr", probeAddr, "--controller-ca-file", probeTLS.CA, "--egress-allowance-cidrs", proc.SuiteAllowance,
			"--id", fmt.Sprintf("prober-%d", i), "--ca-file", caFile, "--ops-addr", proc.Addr(ops), "--concurrency", "16")
		proc.WaitHTTP(t, p, "http://"+proc.Addr(ops)+"/healthz", 30*time.Second)
		probers = append(probers, p)
	}

	external(t, ns, "squid", good.Addr, nil)
	external(t, ns, "spare", spare.Addr, nil)
	external(t, ns, "denying", denying.Addr, nil)
	external(t, ns, "silent", silent, nil)
	external(t, ns, "stranger-ca", good.Addr, &v1.HealthCheck{URL: stranger.URL + "/ip", ExpectedStatus: 200})

	t.Run("a working Squid goes Healthy and reports its exit IP", func(t *testing.T) {
		px := waitHealth(t, ns, "squid", metav1.ConditionTrue)
		assert.True(t, px.Status.Healthy)
		assert.Equal(t, "127.0.0.1", px.Status.EgressIP, "the target echoed the address Squid connected from")
	})
	t.Run("TCP up but no egress is Unhealthy with the failing phase", func(t *testing.T) {
		waitHealth(t, ns, "denying", metav1.ConditionFalse, "connect failed", "403")
		waitHealth(t, ns, "silent", metav1.ConditionFalse, "connect failed", "timed out")
	})
	t.Run("a target certificate from an unknown CA fails at TLS", func(t *testing.T) {
		waitHealth(t, ns, "stranger-ca", metav1.ConditionFalse, "tls failed")
	})
	waitHealth(t, ns, "spare", metav1.ConditionTrue)

	t.Run("each proxy has exactly one prober", func(t *testing.T) {
		require.Eventually(t, func() bool {
			m := scrape(t, metricsURL)
			return m.Sum("proxy_operator_probe_assignments{") == 5 && m["proxy_operator_probers_connected"] == 3
		}, 10*time.Second, 50*time.Millisecond)
	})

	t.Run("a steady fleet causes no status writes", func(t *testing.T) {
		before := scrape(t, metricsURL)
		time.Sleep(10 * interval)
		after := scrape(t, metricsURL)
		probes := after.Sum("proxy_operator_healthcheck_total{") - before.Sum("proxy_operator_healthcheck_total{")
		assert.GreaterOrEqual(t, probes, 5*6.0, "probes kept running")
		assert.Equal(t, before.Sum(`proxy_operator_status_writes_total{writer="health"}`), after.Sum(`proxy_operator_status_writes_total{writer="health"}`), "%v probes, no writes", probes)
	})

	t.Run("a killed prober's proxies are probed again within one interval", func(t *testing.T) {
		probers[1].Kill()
		killed := float64(time.Now().UnixMilli()) / 1000
		require.Eventually(t, func() bool {
			m := scrape(t, metricsURL)
			if m["proxy_operator_probers_connected"] != 2 || m.Sum("proxy_operator_probe_assignments{") != 5 {
				return false
			}
			last := lastProbes(m, ns)
			for _, name := range []string{"squid", "spare", "denying", "silent", "stranger-ca"} {
				if last[name] <= killed {
					return false
				}
			}
			return true
		}, 10*time.Second, 100*time.Millisecond, "not every proxy was probed after the prober died")
		assert.True(t, get(t, ns, "squid").Status.Healthy, "health did not flap")
	})

	parent := t
	t.Run("probers reconnect to a restarted controller", func(t *testing.T) {
		ctrl.Kill()
		// The new controller outlives this subtest: it belongs to the parent.
		ctrl = proc.Start(parent, "controller-2", proc.Build(t, controllerPkg), ctrlArgs...)
		proc.WaitHTTP(t, ctrl, metricsURL, 60*time.Second)
		require.Eventually(t, func() bool {
			m := scrape(t, metricsURL)
			return m["proxy_operator_probers_connected"] == 2 && m.Sum("proxy_operator_probe_assignments{") == 5 &&
				m.Sum("proxy_operator_healthcheck_total{") > 5
		}, 60*time.Second, 200*time.Millisecond, "probers never came back to the new leader")
		assert.True(t, get(t, ns, "squid").Status.Healthy, "a restart does not flap health")
	})

	t.Run("Squid killed goes Unhealthy, restarted goes Healthy", func(t *testing.T) {
		good.Kill()
		waitHealth(t, ns, "squid", metav1.ConditionFalse, "dial failed")
		good.Start()
		waitHealth(t, ns, "squid", metav1.ConditionTrue)
	})
}
