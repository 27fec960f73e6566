package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// The images `make cluster-images` built (hack/cluster/values.yaml names
// them for the chart).
const (
	crawlerImage = "egress-proxies.local/e2e-crawler:dev"
	targetImage  = "egress-proxies.local/e2e-target:dev"
)

// Where the test's own parts live.
const (
	targetNS  = "e2e-target"
	proxiesNS = "e2e-proxies"
	crawlerNS = "e2e-crawler"
	targetURL = "https://target.e2e-target.svc.cluster.local"
	// targetClusterIP is fixed so the installs' egress allowance can
	// name it: the only inside address their proxies reach.
	targetClusterIP = "10.96.200.200"
	// probeInterval is the installs' health interval: short, so the
	// probing bounds below are seconds, not minutes.
	probeInterval = 3 * time.Second
)

func TestInstalledAsUsersDeployIt(t *testing.T) {
	h := newHarness(t)
	plain := &install{release: "egress-proxies", ns: "ep-e2e"}
	tlsInstall := &install{release: "egress-proxies", ns: "ep-e2e-tls"}
	var steps []string
	step := func(name string, fn func()) {
		start := time.Now()
		fn()
		line := fmt.Sprintf("%-64s %6.1fs", name, time.Since(start).Seconds())
		steps = append(steps, line)
		fmt.Println("e2e-cluster:", line)
	}
	t.Cleanup(func() {
		fmt.Println("e2e-cluster: step times")
		for _, s := range steps {
			fmt.Println("  " + s)
		}
		if t.Failed() {
			h.diagnose()
			return
		}
		// A cluster kept for the next run starts it clean.
		for _, ns := range []string{targetNS, proxiesNS, tenantBNS, crawlerNS, plain.ns, tlsInstall.ns} {
			_, _ = h.kubectlOut("delete", "namespace", ns, "--ignore-not-found", "--wait=false")
		}
	})
	step("0. a clean slate and the crawl target", func() {
		h.cleanSlate(plain, tlsInstall)
		h.targetUp()
	})
	step("1. helm install: Deployments Available, Redis on its PVC, NetworkPolicies", func() { h.install(plain) })
	step("2. a ProxyPool of 3 Squid pods Ready and Healthy through the real probe path", func() { h.poolUp(3) })
	step("3. a crawler pod leases over REST, gRPC and the gateway, fetches, reports a ban", func() { h.crawl(plain) })
	step("3b. two tenants' crawler pods at once: each leases only its own proxies", func() { h.tenants(plain) })
	step("3c. kubectl egress: status, explain, cordon, leases, bans, check install, drain, rotate", func() { h.plugin(plain) })
	step("3d. a ProxySource lists the Squid pods: Ready, a leased one drains as the list shrinks", func() { h.sources(plain) })
	step("4. kubectl scale ppool up and down; a leased member drains; the GC deletes members", func() { h.scaleAndDrain(plain) })
	step("5. probers scaled 1 → 3 → 1; controller leader and Redis deleted", func() { h.probersAndFaults(plain) })
	step("6. helm test; helm upgrade rolls without losing leases", func() { h.testAndUpgrade(plain) })
	step("7. helm uninstall: the hook leaves no Squid pod, Proxy, ProxyPool or lease key", func() { h.uninstall(plain) })
	step("8. a second install, in another namespace, with broker TLS: a drain completes", func() {
		h.tlsInstall(tlsInstall)
	})
	step("9. helm uninstall of the TLS install", func() { h.uninstall(tlsInstall) })
}

// poolUp applies the test's ProxyPool with n members and waits until all
// are Ready and Healthy: probed by a prober pod through each Squid pod,
// with that pod's generated credentials, to the target found through
// cluster DNS.
func (h *harness) poolUp(n int) {
	h.namespace(proxiesNS)
	h.applyYAML(fmt.Sprintf(`
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: e2e, namespace: %s}
spec:
  replicas: %d
  template:
    spec:
      provider: kubernetes
      port: 3128
      attributes: {geo: e2e}
  drainTimeout: 10m
`, proxiesNS, n))
	h.poolAt(n)
}

// poolAt waits for the pool to hold n members, all Ready and Healthy,
// and none draining.
func (h *harness) poolAt(n int) []v1alpha1.Proxy {
	t := h.t
	var members []v1alpha1.Proxy
	h.eventually(3*time.Minute, fmt.Sprintf("pool e2e at %d members, all Ready and Healthy", n), func() error {
		var pool v1alpha1.ProxyPool
		if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: proxiesNS, Name: "e2e"}, &pool); err != nil {
			return err
		}
		s := pool.Status
		if s.Replicas != int32(n) || s.ReadyReplicas != int32(n) || s.HealthyReplicas != int32(n) || s.DrainingReplicas != 0 {
			return fmt.Errorf("status %+v", s)
		}
		members = h.members()
		if len(members) != n {
			return fmt.Errorf("%d members", len(members))
		}
		return nil
	})
	for _, px := range members {
		assert.True(t, meta.IsStatusConditionTrue(px.Status.Conditions, v1alpha1.ConditionHealthy), "%s Healthy", px.Name)
		assert.True(t, strings.HasPrefix(px.Status.ProviderID, "kubernetes://"), px.Status.ProviderID)
		// Healthy through the probers, who send the pod's generated
		// credentials; nobody gets through without them.
		assert.Equal(t, "407", connectWithoutCredentials(t, px.Status.IP, px.Spec.Port), "%s asks for credentials", px.Name)
	}
	return members
}

// connectWithoutCredentials asks the proxy for a tunnel to the target and
// returns the status code of its answer.
func connectWithoutCredentials(t *testing.T, ip string, port int32) string {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, fmt.Sprint(port)), 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	host := strings.TrimPrefix(targetURL, "https://") + ":443"
	_, err = fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
	require.NoError(t, err)
	line, err := bufio.NewReader(conn).ReadString('\n')
	require.NoError(t, err)
	fields := strings.Fields(line)
	require.GreaterOrEqual(t, len(fields), 2, "status line %q", line)
	return fields[1]
}

func (h *harness) members() []v1alpha1.Proxy {
	var list v1alpha1.ProxyList
	require.NoError(h.t, h.c.List(context.Background(), &list, client.InNamespace(proxiesNS), client.MatchingLabels{v1alpha1.LabelPool: "e2e"}))
	return list.Items
}

// squidPods are the kubernetes provider's pods of an install.
func (h *harness) squidPods(in *install) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range h.podsOf(in.ns, "") {
		if strings.HasPrefix(p.Name, "px-") {
			out = append(out, p)
		}
	}
	return out
}

// crawl runs the crawler pod (a Job) against an install and checks what
// it saw.
func (h *harness) crawl(in *install) {
	t := h.t
	h.namespace(crawlerNS)
	token := h.secretData(in.ns, in.release+"-discovery-token", "token")
	require.NotEmpty(t, token, "the generated lease API token")
	gwToken := h.secretData(in.ns, in.release+"-gateway-token", "token")
	require.NotEmpty(t, gwToken, "the generated gateway-only token")
	data := map[string][]byte{"token": token, "gateway-token": gwToken, "target-ca.crt": h.targetTLS["ca.crt"]}
	args := []string{
		fmt.Sprintf("--rest=%s://%s-discovery-service.%s.svc:8090", in.scheme(), in.release, in.ns),
		fmt.Sprintf("--grpc=%s-broker-grpc.%s.svc:9090", in.release, in.ns),
		"--token-file=/etc/crawler/token", "--target=" + targetURL, "--target-ca-file=/etc/crawler/target-ca.crt",
		"--namespace=" + proxiesNS, "--selector=geo=e2e",
		fmt.Sprintf("--gateway=%s-gateway.%s.svc:8888", in.release, in.ns), "--gateway-token-file=/etc/crawler/gateway-token",
	}
	if in.brokerCA != nil {
		data["broker-ca.crt"] = in.brokerCA
		args = append(args, "--broker-ca-file=/etc/crawler/broker-ca.crt")
	}
	seen := h.runCrawlers(map[string]crawlerRun{"crawler-" + in.ns: {data, args}})["crawler-"+in.ns]
	one := func(step string) map[string]any {
		require.Len(t, seen[step], 1, "crawler step %s", step)
		return seen[step][0]
	}
	for _, proto := range []string{"rest", "grpc"} {
		lease := one(proto + "-lease")
		assert.Equal(t, true, lease["credentials"], "%s: a lease carries the proxy's credentials", proto)
		if proto == "rest" {
			inside := seen["rest-inside"]
			require.Len(t, inside, 5, "every way inside was tried")
			for _, r := range inside {
				assert.EqualValues(t, 403, r["status"], "through a leased proxy with its credentials: %s", r["url"])
			}
		}
		fetch := one(proto + "-fetch")
		assert.EqualValues(t, 200, fetch["status"], "%s: the target fetched through the leased proxy", proto)
		assert.NotEmpty(t, fetch["egressIP"], "%s: the target saw the proxy's address", proto)
		report := one(proto + "-report")
		assert.EqualValues(t, 429, report["status"], "%s: the target rate-limited", proto)
	}
	restReport := one("rest-report")["answer"].(map[string]any)
	assert.Contains(t, restReport["actions"], "COOLDOWN_STARTED", "REST: the ban started a cooldown: %v", restReport)
	assert.NotEmpty(t, restReport["cooldownUntil"])
	first, again := one("rest-lease")["proxy"], one("rest-lease-again")["proxy"]
	assert.NotEqual(t, first, again, "the cooling proxy is not leased again for the target")
	assert.NotEmpty(t, one("grpc-report")["actions"], "gRPC: the broker says what it did")
	releases := seen["rest-release"]
	require.Len(t, releases, 3)
	for _, r := range releases {
		assert.EqualValues(t, 204, r["status"], "DELETE /v1/leases/{id}: 204, and 204 again")
	}
	one("grpc-release")

	assert.EqualValues(t, 403, one("gateway-token-api")["status"], "the chart's gateway token cannot lease over the API")
	gw := one("gateway-fetch")
	assert.EqualValues(t, 200, gw["status"], "through the gateway, with only a proxy URL")
	assert.NotEmpty(t, gw["egressIP"])
	inside := one("gateway-inside")
	assert.EqualValues(t, 403, inside["status"], "the gateway refuses the metadata address: %v", inside["answer"])
	ips := one("gateway-session")["egressIPs"].([]any)
	require.Len(t, ips, 2)
	assert.Equal(t, ips[0], ips[1], "a session keeps its proxy from one connection to the next")
	gwReport := one("gateway-report")
	assert.EqualValues(t, 429, gwReport["status"])
	assert.Contains(t, gwReport["answer"].(map[string]any)["actions"], "COOLDOWN_STARTED", "a report by session and target: %v", gwReport["answer"])
	assert.NotEqual(t, ips[0], one("gateway-moved")["egressIP"], "the session moves off the proxy cooling for the target")
	one("done")
}
