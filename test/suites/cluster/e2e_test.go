package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
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

// install is one Helm release of the chart.
type install struct {
	release, ns string
	// brokerCA is set for an install with broker TLS: the CA of its
	// certificate.
	brokerCA []byte
}

func (in *install) scheme() string {
	if in.brokerCA != nil {
		return "https"
	}
	return "http"
}

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

// cleanSlate removes what an earlier, interrupted run left.
func (h *harness) cleanSlate(installs ...*install) {
	for _, in := range installs {
		if out, _ := h.helm("status", in.release, "-n", in.ns); out != "" {
			_, _ = h.helm("uninstall", in.release, "-n", in.ns, "--wait", "--timeout", "3m")
		}
	}
	for _, ns := range []string{targetNS, proxiesNS, crawlerNS, installs[0].ns, installs[1].ns} {
		_, _ = h.kubectlOut("delete", "namespace", ns, "--ignore-not-found", "--wait", "--timeout", "3m")
	}
}

// targetUp runs the crawl target: HTTPS with a certificate for its
// Service's names, from a CA the probers and the crawler are given.
func (h *harness) targetUp() {
	h.namespace(targetNS)
	h.targetTLS = serverTLS(h.t, serviceNames("target", targetNS)...)
	h.secret(targetNS, "target-tls", corev1.SecretTypeTLS, h.targetTLS)
	h.applyYAML(fmt.Sprintf(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: target, namespace: %[1]s}
spec:
  replicas: 1
  selector: {matchLabels: {app: target}}
  template:
    metadata: {labels: {app: target}}
    spec:
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: target
          image: %[2]s
          args: [--addr=:8443]
          ports: [{name: https, containerPort: 8443}]
          readinessProbe: {tcpSocket: {port: https}}
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          volumeMounts: [{name: tls, mountPath: /etc/target, readOnly: true}]
      volumes: [{name: tls, secret: {secretName: target-tls}}]
---
apiVersion: v1
kind: Service
metadata: {name: target, namespace: %[1]s}
spec:
  clusterIP: %[3]s
  selector: {app: target}
  ports: [{name: https, port: 443, targetPort: https}]
`, targetNS, targetImage, targetClusterIP))
	h.mustKubectl("rollout", "status", "deployment/target", "-n", targetNS, "--timeout", "2m")
}

// values are what an install sets beyond hack/cluster/values.yaml (the
// local images): the probe target (the default is on the internet), a
// short interval, the target's CA for the probers, and broker TLS.
func (h *harness) values(in *install) string {
	v := fmt.Sprintf(`controller:
  health:
    url: %s/ok
    expectedStatus: 204
    interval: %s
    timeout: 2s
egress:
  # The in-cluster crawl target's Service: inside, so let through by name.
  allowanceCIDRs: %[3]s/32
networkPolicies:
  # Where the test's crawler runs (the cluster here enforces no
  # NetworkPolicy; a user's that does would need it).
  proxyClientNamespaces: [%[4]s]
prober:
  extraArgs: [--ca-file=/etc/e2e-target/ca.crt]
  extraVolumes: [{name: target-ca, secret: {secretName: e2e-target-ca}}]
  extraVolumeMounts: [{name: target-ca, mountPath: /etc/e2e-target, readOnly: true}]
`, targetURL, probeInterval, targetClusterIP, crawlerNS)
	if in.brokerCA != nil {
		v += "broker:\n  tls: {enabled: true, source: existing, secretName: broker-tls}\n"
	} else {
		v += fmt.Sprintf("tenants:\n  - {name: team-a, namespaces: [%s]}\n  - {name: team-b, namespaces: [%s], quotas: {reportsPerSecond: 5}}\n", proxiesNS, tenantBNS)
		// Where step 3d's ProxySource keeps its members' credentials.
		v += fmt.Sprintf("secretNamespaces: [%s]\n", proxiesNS)
	}
	f := filepath.Join(h.dir, in.ns+"-values.yaml")
	require.NoError(h.t, os.WriteFile(f, []byte(v), 0o644))
	return f
}

func (h *harness) chartArgs(in *install) []string {
	return []string{in.release, filepath.Join(h.repo, "charts", "egress-proxies"), "-n", in.ns,
		"-f", filepath.Join(h.repo, "hack", "cluster", "values.yaml"), "-f", h.values(in)}
}

// install runs helm install with the chart's defaults but for the
// values above, then checks what a user sees.
func (h *harness) install(in *install) {
	t := h.t
	h.namespace(in.ns)
	h.namespace(proxiesNS) // a secretNamespace: its Roles go in at install
	h.secret(in.ns, "e2e-target-ca", corev1.SecretTypeOpaque, map[string][]byte{"ca.crt": h.targetTLS["ca.crt"]})
	out, err := h.helm(append(append([]string{"install"}, h.chartArgs(in)...), "--wait", "--timeout", "5m")...)
	require.NoError(t, err, out)

	for _, d := range []string{"controller", "prober", "broker"} {
		want := h.mustKubectl("get", "deployment", in.release+"-"+d, "-n", in.ns, "-o", "jsonpath={.spec.replicas}")
		got := h.mustKubectl("get", "deployment", in.release+"-"+d, "-n", in.ns, "-o", `jsonpath={.status.conditions[?(@.type=="Available")].status}/{.status.availableReplicas}`)
		assert.Equal(t, "True/"+want, got, "deployment %s Available with every replica", d)
	}
	// The bundled Redis: on a PVC the default StorageClass provisioned,
	// asking for the password the chart generated.
	pvc := h.mustKubectl("get", "pvc", "data-"+in.release+"-redis-0", "-n", in.ns, "-o", "jsonpath={.status.phase}/{.spec.storageClassName}")
	assert.Equal(t, "Bound/local-path", pvc)
	password := h.secretData(in.ns, in.release+"-redis", "password")
	require.Len(t, password, 32, "the generated Redis password")
	redisIP := h.podIP(in.ns, in.release+"-redis-0")
	assert.Equal(t, "-NOAUTH Authentication required.", redisCommand(t, redisIP, nil, "PING"))
	assert.Equal(t, "+PONG", redisCommand(t, redisIP, password, "PING"))

	var policies []string
	for _, n := range strings.Fields(h.mustKubectl("get", "networkpolicy", "-n", in.ns, "-o", "jsonpath={.items[*].metadata.name}")) {
		policies = append(policies, strings.TrimPrefix(n, in.release+"-"))
	}
	sort.Strings(policies)
	assert.Equal(t, []string{"broker", "controller", "prober", "proxies", "redis"}, policies)

	// A full Redis refuses rather than evicts; its password is in its
	// config file, not on its command line.
	assert.Equal(t, "*2 $16 maxmemory-policy $10 noeviction", redisCommand(t, redisIP, password, "CONFIG GET maxmemory-policy"))

	// Least privilege: neither service account may read Secrets outside
	// the release's namespace and secretNamespaces (e2e-proxies here), and
	// in it the broker only its tenants' credentials: not the KVM SSH
	// key, not Helm's release.
	can := func(sa string, args ...string) string {
		out, _ := h.kubectlOut(append(append([]string{"auth", "can-i"}, args...), "--as", "system:serviceaccount:"+in.ns+":"+in.release+"-"+sa)...)
		return strings.TrimSpace(out)
	}
	for _, sa := range []string{"broker", "controller"} {
		assert.Equal(t, "no", can(sa, "list", "secrets", "-n", "kube-system"), "%s may list Secrets in kube-system", sa)
	}
	assert.Equal(t, "yes", can("controller", "list", "secrets", "-n", in.ns), "the controller reads Secrets in its own namespace")
	assert.Equal(t, "no", can("broker", "list", "secrets", "-n", in.ns), "the broker lists no Secret of the release namespace")
	for _, secret := range []string{in.release + "-kvm-ssh", "kvm-ssh", "sh.helm.release.v1." + in.release + ".v1", in.release + "-redis"} {
		assert.Equal(t, "no", can("broker", "get", "secret/"+secret, "-n", in.ns), "the broker may read Secret %s", secret)
	}
	if in.brokerCA == nil {
		assert.Equal(t, "yes", can("broker", "get", "secret/"+in.release+"-tenant-team-a", "-n", in.ns), "the broker reads its tenants' credentials")
	}
}

func (h *harness) podIP(ns, name string) string {
	h.t.Helper()
	var ip string
	h.eventually(2*time.Minute, "pod "+ns+"/"+name+" running with an address", func() error {
		var p corev1.Pod
		if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &p); err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
			return fmt.Errorf("phase %s, IP %q", p.Status.Phase, p.Status.PodIP)
		}
		ip = p.Status.PodIP
		return nil
	})
	return ip
}

// redisCommand sends one inline command, after AUTH when password is
// given, and returns Redis's one-line answer.
func redisCommand(t *testing.T, ip string, password []byte, cmd string) string {
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(ip, "6379"), 5*time.Second)
	require.NoError(t, err)
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(conn)
	if password != nil {
		_, err = fmt.Fprintf(conn, "AUTH %s\r\n", password)
		require.NoError(t, err)
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		require.Equal(t, "+OK", strings.TrimSpace(line))
	}
	_, err = fmt.Fprintf(conn, "%s\r\n", cmd)
	require.NoError(t, err)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	line = strings.TrimSpace(line)
	// An array of bulk strings ("*2"): its lines, joined by spaces.
	if n, err := strconv.Atoi(strings.TrimPrefix(line, "*")); err == nil && strings.HasPrefix(line, "*") {
		for range 2 * n {
			next, err := r.ReadString('\n')
			require.NoError(t, err)
			line += " " + strings.TrimSpace(next)
		}
	}
	return line
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

// crawlerRun is one crawler Job: its Secret's data (mounted at
// /etc/crawler) and its arguments.
type crawlerRun struct {
	data map[string][]byte
	args []string
}

// runCrawlers runs crawler Jobs at once, each named by its key with a
// Secret of the same name, waits for all to succeed, and returns each
// one's JSON lines by step.
func (h *harness) runCrawlers(runs map[string]crawlerRun) map[string]map[string][]map[string]any {
	t := h.t
	h.namespace(crawlerNS)
	for job, run := range runs {
		argsJSON, err := json.Marshal(run.args)
		require.NoError(t, err)
		_, _ = h.kubectlOut("delete", "job", job, "-n", crawlerNS, "--ignore-not-found", "--wait")
		_, _ = h.kubectlOut("delete", "secret", job, "-n", crawlerNS, "--ignore-not-found")
		h.secret(crawlerNS, job, corev1.SecretTypeOpaque, run.data)
		h.applyYAML(fmt.Sprintf(`
apiVersion: batch/v1
kind: Job
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
      containers:
        - name: crawler
          image: %[3]s
          args: %[4]s
          securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: {drop: [ALL]}}
          volumeMounts: [{name: crawler, mountPath: /etc/crawler, readOnly: true}]
      volumes: [{name: crawler, secret: {secretName: %[1]s}}]
`, job, crawlerNS, crawlerImage, argsJSON))
	}
	out := map[string]map[string][]map[string]any{}
	for job := range runs {
		h.eventually(3*time.Minute, "crawler Job "+job+" to finish", func() error {
			out, err := h.kubectlOut("get", "job", job, "-n", crawlerNS, "-o", "jsonpath={.status.succeeded}/{.status.failed}")
			if err != nil {
				return err
			}
			switch out {
			case "1/":
				return nil
			case "/1":
				logs, _ := h.kubectlOut("logs", "job/"+job, "-n", crawlerNS)
				t.Fatalf("crawler %s failed:\n%s", job, logs)
			}
			return fmt.Errorf("job status %q", out)
		})
		logs := h.mustKubectl("logs", "job/"+job, "-n", crawlerNS)
		t.Logf("%s:\n%s", job, logs)
		seen := map[string][]map[string]any{}
		for _, line := range strings.Split(logs, "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil {
				seen[fmt.Sprint(m["step"])] = append(seen[fmt.Sprint(m["step"])], m)
			}
		}
		out[job] = seen
	}
	return out
}

// tenantBNS holds team-b's proxies; team-a's are proxiesNS's.
const tenantBNS = "e2e-tenant-b"

// tenants runs a crawler pod for each of the install's two tenants at
// once, with the credentials the chart generated: each lists and leases
// only its own namespace's proxies, naming none, and is refused the
// other's. team-b reports every lease blocked, for the target team-a
// leases for too: its storm cools its own proxy for itself alone
// (neither tenant is trusted) and paces nothing, so team-a is never
// refused.
func (h *harness) tenants(in *install) {
	t := h.t
	h.namespace(tenantBNS)
	h.applyYAML(fmt.Sprintf(`
apiVersion: crawl.example.com/v1alpha1
kind: ProxyPool
metadata: {name: b, namespace: %s}
spec:
  replicas: 1
  template:
    spec:
      provider: kubernetes
      port: 3128
      attributes: {geo: e2e}
`, tenantBNS))
	h.eventually(3*time.Minute, "team-b's proxy Ready and Healthy", func() error {
		out, err := h.kubectlOut("get", "proxies", "-n", tenantBNS, "-o", `jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{.status.conditions[?(@.type=="Healthy")].status} {end}`)
		if err != nil || strings.TrimSpace(out) != "TrueTrue" {
			return fmt.Errorf("proxies: %q %v", out, err)
		}
		return nil
	})
	for _, name := range []string{"team-a", "team-b"} {
		ready := h.mustKubectl("get", "tenant", name, "-n", in.ns, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		assert.Equal(t, "True", ready, "tenant %s read its credential", name)
	}
	run := func(tenant, other string, extra ...string) crawlerRun {
		token := h.secretData(in.ns, in.release+"-tenant-"+tenant, "token")
		require.NotEmpty(t, token, "the chart generated %s's credential", tenant)
		return crawlerRun{data: map[string][]byte{"token": token, "target-ca.crt": h.targetTLS["ca.crt"]}, args: append([]string{
			fmt.Sprintf("--rest=%s://%s-discovery-service.%s.svc:8090", in.scheme(), in.release, in.ns),
			"--token-file=/etc/crawler/token", "--target=" + targetURL, "--target-ca-file=/etc/crawler/target-ca.crt",
			"--tenant-for=10s", "--lease-target=tenants.e2e.example", "--other-namespace=" + other}, extra...)}
	}
	seen := h.runCrawlers(map[string]crawlerRun{
		"tenant-a": run("team-a", tenantBNS),
		"tenant-b": run("team-b", proxiesNS, "--report=blocked"),
	})
	for job, own := range map[string]string{"tenant-a": proxiesNS, "tenant-b": tenantBNS} {
		require.Len(t, seen[job]["tenant-list"], 1, job)
		listed := seen[job]["tenant-list"][0]["proxies"].([]any)
		require.NotEmpty(t, listed, job)
		for _, id := range listed {
			assert.True(t, strings.HasPrefix(id.(string), own+"/"), "%s listed %s", job, id)
		}
		assert.EqualValues(t, 403, seen[job]["tenant-other"][0]["status"], "%s is refused the other's namespace", job)
		leases := seen[job]["tenant-leases"][0]
		t.Logf("%s: %v", job, leases)
		require.NotEmpty(t, leases["byProxy"], job)
		for id := range leases["byProxy"].(map[string]any) {
			assert.True(t, strings.HasPrefix(id, own+"/"), "%s leased %s", job, id)
		}
		if job == "tenant-a" {
			assert.Empty(t, leases["refused"], "%s leased throughout, never refused", job)
			assert.Greater(t, leases["leases"].(float64), 10.0, job)
		}
	}
	storm := seen["tenant-b"]["tenant-leases"][0]
	reports := storm["reports"].(map[string]any)
	assert.EqualValues(t, 1, reports["COOLDOWN_STARTED,TENANT_ONLY"], "team-b's first block cools its proxy for itself: %v", reports)
	for actions := range reports {
		assert.Contains(t, actions, "TENANT_ONLY", "no report of team-b's is the fleet's: %v", reports)
	}
	assert.EqualValues(t, 1, storm["leases"], "its one proxy cools for team-b after its first report")
	for code := range storm["refused"].(map[string]any) {
		assert.Equal(t, "429", code, "then team-b is refused (ALL_COOLING_DOWN): %v", storm["refused"])
	}
	// One broker holds the tenant-status Lease and writes what every
	// broker served, whichever one the crawlers called.
	holder := h.mustKubectl("get", "lease", in.release+"-broker-tenant-status", "-n", in.ns, "-o", "jsonpath={.spec.holderIdentity}")
	assert.NotEmpty(t, holder, "a broker leads the Tenants' status")
	h.eventually(2*time.Minute, "both tenants' status.lastSeen", func() error {
		out, err := h.kubectlOut("get", "tenants", "-n", in.ns, "-o", `jsonpath={range .items[*]}{.metadata.name}={.status.lastSeen} {end}`)
		if err != nil || strings.Contains(out, "= ") || strings.Count(out, "=") < 2 {
			return fmt.Errorf("tenants: %q %v", out, err)
		}
		return nil
	})
	// Gone before the next steps count the fleet.
	h.mustKubectl("delete", "proxypool", "b", "-n", tenantBNS, "--wait=false")
	h.eventually(2*time.Minute, "team-b's proxy deleted", func() error {
		out, err := h.kubectlOut("get", "proxies", "-n", tenantBNS, "-o", "name")
		if err != nil || strings.TrimSpace(out) != "" {
			return fmt.Errorf("proxies left: %q %v", out, err)
		}
		return nil
	})
}

// leaseAll takes n leases with no target from this host, one per proxy
// (least loaded first), and returns them by proxy id.
func (h *harness) leaseAll(in *install, n int) map[string]*leaseclient.Lease {
	t := h.t
	c := h.leaser(in)
	out := map[string]*leaseclient.Lease{}
	for i := 0; i < n; i++ {
		var l *leaseclient.Lease
		h.eventually(time.Minute, "a lease from the broker", func() error {
			var err error
			l, err = c.Lease(context.Background(), leaseclient.Request{Namespace: proxiesNS, Selector: map[string]string{"geo": "e2e"}, TTL: 10 * time.Minute})
			return err
		})
		out[l.Proxy.GetId()] = l
	}
	require.Len(t, out, n, "one lease a proxy")
	return out
}

// drainOne waits for one member (not one of done) to drain, checks it
// stays while its lease lives (two broker polls of the controller), the
// only one draining, releases the lease, and waits for the member to go.
func (h *harness) drainOne(leases map[string]*leaseclient.Lease, done []string) string {
	t := h.t
	var draining []string
	h.eventually(time.Minute, "a member draining", func() error {
		draining = nil
		for _, px := range h.members() {
			id := px.Namespace + "/" + px.Name
			if _, ok := px.Annotations[v1alpha1.AnnotationDrainDeadline]; ok && !slices.Contains(done, id) {
				draining = append(draining, id)
			}
		}
		if len(draining) == 0 {
			return fmt.Errorf("none")
		}
		return nil
	})
	require.Len(t, draining, 1, "the disruption budget drains one member at a time")
	id := draining[0]
	h.logf("%s draining", id)
	require.Contains(t, leases, id, "a drained member holds one of the test's leases")
	time.Sleep(12 * time.Second)
	var px v1alpha1.Proxy
	require.NoError(t, h.c.Get(context.Background(), client.ObjectKey{Namespace: proxiesNS, Name: strings.TrimPrefix(id, proxiesNS+"/")}, &px),
		"%s stays while its lease lives", id)
	require.NoError(t, leases[id].Release(context.Background()))
	h.logf("%s: lease released", id)
	h.eventually(time.Minute, id+" deleted once its lease is released", func() error {
		err := h.c.Get(context.Background(), client.ObjectKey{Namespace: proxiesNS, Name: px.Name}, &v1alpha1.Proxy{})
		if err == nil {
			return fmt.Errorf("%s is still there", id)
		}
		return client.IgnoreNotFound(err)
	})
	h.logf("%s deleted", id)
	return id
}

// scaleAndDrain scales the pool up and down with a lease on every member:
// the surplus drains until its lease is released, then goes; deleting
// the pool deletes its members through the garbage collector.
func (h *harness) scaleAndDrain(in *install) {
	t := h.t
	h.mustKubectl("scale", "ppool", "e2e", "-n", proxiesNS, "--replicas=4")
	h.poolAt(4)
	h.logf("pool at 4 members")
	leases := h.leaseAll(in, 4)
	h.logf("a lease on each member")
	h.mustKubectl("scale", "ppool", "e2e", "-n", proxiesNS, "--replicas=2")
	// The disruption budget (10%%, at least one) drains one member at a
	// time; each stays while its lease lives.
	var drained []string
	for range 2 {
		id := h.drainOne(leases, drained)
		drained = append(drained, id)
	}
	h.poolAt(2)
	for id, l := range leases {
		if !slices.Contains(drained, id) {
			require.NoError(t, l.Release(context.Background()))
		}
	}
	// The pool has no finalizer: its members go by their owner reference,
	// through kube-controller-manager's garbage collector, and their
	// Squid pods through the controller's finalizer.
	h.logf("pool at 2 members")
	h.mustKubectl("delete", "ppool", "e2e", "-n", proxiesNS, "--wait=false")
	h.eventually(2*time.Minute, "the pool's members and Squid pods deleted", func() error {
		if n := len(h.members()); n > 0 {
			return fmt.Errorf("%d members left", n)
		}
		if n := len(h.squidPods(in)); n > 0 {
			return fmt.Errorf("%d Squid pods left", n)
		}
		return nil
	})
	h.logf("pool deleted with its members and their Squid pods")
}
