package cluster

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
