package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

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
