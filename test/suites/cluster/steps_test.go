package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// probeWatch samples when each proxy was last probed and keeps, per
// proxy, the longest time it went without a probe.
type probeWatch struct {
	stop chan struct{}
	done sync.WaitGroup
	mu   sync.Mutex
	last map[string]float64
	gap  map[string]time.Duration
}

func (h *harness) watchProbes(in *install) *probeWatch {
	w := &probeWatch{stop: make(chan struct{}), last: map[string]float64{}, gap: map[string]time.Duration{}}
	w.done.Add(1)
	go func() {
		defer w.done.Done()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(250 * time.Millisecond):
			}
			probes, err := h.lastProbes(in)
			if err != nil {
				continue
			}
			w.mu.Lock()
			for name, at := range probes {
				if prev, ok := w.last[name]; ok && at > prev {
					w.gap[name] = max(w.gap[name], time.Duration((at-prev)*float64(time.Second)))
				}
				if at > w.last[name] {
					w.last[name] = at
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// finish stops sampling and returns each proxy's longest gap, the time
// since its last probe included.
func (w *probeWatch) finish() map[string]time.Duration {
	close(w.stop)
	w.done.Wait()
	now := float64(time.Now().UnixMilli()) / 1000
	for name, at := range w.last {
		w.gap[name] = max(w.gap[name], time.Duration((now-at)*float64(time.Second)))
	}
	return w.gap
}

// scaleProbers scales the prober Deployment as users do and waits until
// the leader has exactly those probers connected and every proxy
// assigned to one of them.
func (h *harness) scaleProbers(in *install, n, proxies int) {
	t := h.t
	deploy := in.release + "-prober"
	h.mustKubectl("scale", "deployment", deploy, "-n", in.ns, fmt.Sprintf("--replicas=%d", n))
	h.mustKubectl("rollout", "status", "deployment/"+deploy, "-n", in.ns, "--timeout", "2m")
	h.eventually(time.Minute, fmt.Sprintf("%d probers connected, sharing %d proxies", n, proxies), func() error {
		var running []string
		for _, p := range h.podsOf(in.ns, "app.kubernetes.io/component=prober") {
			if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				running = append(running, p.Name)
			}
		}
		m, err := h.leaderMetrics(in)
		if err != nil {
			return err
		}
		if got := m["proxy_operator_probers_connected"]; int(got) != n || len(running) != n {
			return fmt.Errorf("%v probers connected, %d running", got, len(running))
		}
		sum := 0.0
		for _, p := range running {
			sum += m[fmt.Sprintf(`proxy_operator_probe_assignments{prober=%q}`, p)]
		}
		if int(sum) != proxies {
			return fmt.Errorf("the running probers %v hold %v of %d proxies", running, sum, proxies)
		}
		return nil
	})
	t.Logf("%d probers connected, every proxy assigned to one of them", n)
}

// probersAndFaults scales the probe fleet on its own, then deletes the
// controller's leader and the Redis pod: no proxy goes unprobed for more
// than two intervals while probers come and go, live leases survive, and
// nothing is created twice.
func (h *harness) probersAndFaults(in *install) {
	t := h.t
	const n = 4
	h.poolUp(n)
	before := h.instances(in)
	require.Len(t, before, n)

	w := h.watchProbes(in)
	h.scaleProbers(in, 1, n)
	h.scaleProbers(in, 3, n)
	h.scaleProbers(in, 1, n)
	time.Sleep(2 * probeInterval)
	gaps := w.finish()
	require.Len(t, gaps, n, "every member probed: %v", gaps)
	for name, gap := range gaps {
		assert.LessOrEqual(t, gap, 2*probeInterval, "%s went %s without a probe while probers came and went", name, gap)
	}
	t.Logf("longest time without a probe while probers scaled 1 → 3 → 1: %v", gaps)

	leases := h.leaseAll(in, 2)
	old := h.leader(in)
	require.NotEmpty(t, old)
	h.mustKubectl("delete", "pod", old, "-n", in.ns, "--wait=false")
	var elected time.Time
	h.eventually(time.Minute, "a new controller leader", func() error {
		if l := h.leader(in); l == "" || l == old {
			return fmt.Errorf("leader %q", l)
		}
		elected = time.Now()
		return nil
	})
	h.eventually(2*time.Minute, "every proxy probed again for the new leader", func() error {
		m, err := h.leaderMetrics(in)
		if err != nil {
			return err
		}
		for _, px := range h.members() {
			at := m.Sum(fmt.Sprintf(`proxy_operator_healthcheck_last_timestamp_seconds{name=%q,`, px.Name))
			if at < float64(elected.UnixMilli())/1000 {
				return fmt.Errorf("%s last probed at %v, before the election", px.Name, at)
			}
		}
		return nil
	})

	redis := in.release + "-redis-0"
	var pod corev1.Pod
	require.NoError(t, h.c.Get(context.Background(), client.ObjectKey{Namespace: in.ns, Name: redis}, &pod))
	h.mustKubectl("delete", "pod", redis, "-n", in.ns)
	h.eventually(2*time.Minute, "Redis back on its volume", func() error {
		var p corev1.Pod
		if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: in.ns, Name: redis}, &p); err != nil {
			return err
		}
		if p.UID == pod.UID {
			return fmt.Errorf("the old pod is still there")
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("not ready")
	})
	h.leasesLive(in, leases)
	for _, l := range leases {
		require.NoError(t, l.Release(context.Background()))
	}
	assert.Equal(t, before, h.instances(in), "the same instances, none made twice, after the faults")
}

// instances maps each member to its instance and the Squid pod's UID.
func (h *harness) instances(in *install) map[string]string {
	pods := map[string]string{}
	for _, p := range h.squidPods(in) {
		pods["kubernetes://"+p.Namespace+"/"+p.Name] = string(p.UID)
	}
	out := map[string]string{}
	for _, px := range h.members() {
		out[px.Name] = px.Status.ProviderID + " " + pods[px.Status.ProviderID]
	}
	require.Len(h.t, pods, len(out), "one Squid pod a member: %v", pods)
	return out
}

// leasesLive checks that each lease still holds: it renews, and the
// broker lists its proxy with a live lease.
func (h *harness) leasesLive(in *install, leases map[string]*leaseclient.Lease) {
	t := h.t
	h.eventually(time.Minute, "every lease renewed", func() error {
		for id, l := range leases {
			if err := l.Renew(context.Background(), 10*time.Minute); err != nil {
				return fmt.Errorf("renewing the lease on %s: %w", id, err)
			}
		}
		return nil
	})
	// A new connection, as a crawler starting now makes: right after a
	// rollout it may take a retry, as the Go client's Lease does.
	counts := map[string]int32{}
	api := h.leaser(in).API()
	h.eventually(time.Minute, "the broker's list of proxies", func() error {
		list, err := api.ListProxies(context.Background(), &leasev1.ListProxiesRequest{Namespace: proxiesNS})
		if err != nil {
			h.logf("listing proxies: %v", err)
			return err
		}
		for _, p := range list.GetProxies() {
			counts[p.GetId()] = p.GetLeaseCount()
		}
		return nil
	})
	for id := range leases {
		assert.Equal(t, int32(1), counts[id], "the broker lists %s with its lease", id)
	}
}

// testAndUpgrade runs helm test, then upgrades the release to the same
// chart with a changed value while leases are held.
func (h *harness) testAndUpgrade(in *install) {
	t := h.t
	out, err := h.helm("test", in.release, "-n", in.ns, "--timeout", "3m")
	require.NoError(t, err, out)
	assert.Contains(t, out, "Succeeded")

	leases := h.leaseAll(in, 2)
	old := map[string]bool{}
	for _, p := range h.podsOf(in.ns, "app.kubernetes.io/component in (broker,controller)") {
		old[p.Name] = true
	}
	out, err = h.helm(append(append([]string{"upgrade"}, h.chartArgs(in)...),
		"--set", "broker.logLevel=debug", "--set", "controller.logLevel=debug", "--wait", "--timeout", "5m")...)
	require.NoError(t, err, out)
	h.eventually(2*time.Minute, "every broker and controller pod replaced", func() error {
		for _, p := range h.podsOf(in.ns, "app.kubernetes.io/component in (broker,controller)") {
			if old[p.Name] {
				return fmt.Errorf("%s is still there", p.Name)
			}
		}
		return nil
	})
	h.leasesLive(in, leases)
	for _, l := range leases {
		require.NoError(t, l.Release(context.Background()))
	}
}

// uninstall runs helm uninstall with a lease live: the pre-delete hook
// deletes every ProxyPool and Proxy and waits for their instances; the
// brokers drop the deleted proxies' leases before Redis stops.
func (h *harness) uninstall(in *install) {
	t := h.t
	if len(h.members()) == 0 {
		h.poolUp(2)
	}
	leases := h.leaseAll(in, 1)
	require.Len(t, leases, 1)
	pv := h.mustKubectl("get", "pvc", "data-"+in.release+"-redis-0", "-n", in.ns, "-o", "jsonpath={.spec.volumeName}")
	dir := h.mustKubectl("get", "pv", pv, "-o", "jsonpath={.spec.hostPath.path}{.spec.local.path}")
	require.NotEmpty(t, dir)

	out, err := h.helm("uninstall", in.release, "-n", in.ns, "--wait", "--timeout", "5m")
	require.NoError(t, err, out)
	var proxies v1alpha1.ProxyList
	require.NoError(t, h.c.List(context.Background(), &proxies))
	assert.Empty(t, proxies.Items, "no Proxy left")
	var pools v1alpha1.ProxyPoolList
	require.NoError(t, h.c.List(context.Background(), &pools))
	assert.Empty(t, pools.Items, "no ProxyPool left")
	h.eventually(2*time.Minute, "the release's pods gone", func() error {
		if pods := h.podsOf(in.ns, ""); len(pods) > 0 {
			return fmt.Errorf("%d pods left, %s first", len(pods), pods[0].Name)
		}
		return nil
	})
	keys := redisKeysOnVolume(t, dir, "*:lease:*")
	assert.Empty(t, keys, "no lease key in the Redis the release left on its volume")
	h.mustKubectl("delete", "pvc", "--all", "-n", in.ns)
}

// redisKeysOnVolume loads a copy of the data a Redis left on its volume
// into a Redis of this host (on a unix socket) and lists the keys
// matching pattern.
func redisKeysOnVolume(t *testing.T, dir, pattern string) []string {
	work := t.TempDir()
	require.NoError(t, exec.Command("cp", "-a", dir+"/.", work).Run())
	sock := filepath.Join(work, "redis.sock")
	srv := exec.Command("redis-server", "--port", "0", "--unixsocket", sock, "--dir", work,
		"--appendonly", "yes", "--save", "")
	require.NoError(t, srv.Start())
	defer func() { _ = srv.Process.Kill(); _ = srv.Wait() }()
	var out []byte
	require.NoError(t, wait(30*time.Second, "the copied Redis to load its AOF", func() error {
		var err error
		out, err = exec.Command("redis-cli", "-s", sock, "--scan", "--pattern", pattern).CombinedOutput()
		if err != nil || strings.Contains(string(out), "LOADING") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}))
	return strings.Fields(string(out))
}

// tlsInstall is a second install, in another namespace, with broker TLS:
// the controller, the crawler and the probers all speak TLS, and a drain
// completes, which needs the controller to read leases from the brokers.
func (h *harness) tlsInstall(in *install) {
	t := h.t
	h.namespace(in.ns)
	names := append(serviceNames(in.release+"-broker-grpc", in.ns), serviceNames(in.release+"-discovery-service", in.ns)...)
	brokerTLS := serverTLS(t, names...)
	h.secret(in.ns, "broker-tls", corev1.SecretTypeTLS, brokerTLS)
	in.brokerCA = brokerTLS["ca.crt"]
	h.install(in)
	h.poolUp(2)
	h.crawl(in)
	out, err := h.helm("test", in.release, "-n", in.ns, "--timeout", "3m")
	require.NoError(t, err, out)

	// Polls may fail while the brokers start; none may fail once they
	// serve, which a plaintext dial to a TLS broker would, every time.
	m, err := h.leaderMetrics(in)
	require.NoError(t, err)
	errorsBefore := m["proxy_operator_leaseview_poll_errors_total"]
	leases := h.leaseAll(in, 2)
	h.mustKubectl("scale", "ppool", "e2e", "-n", proxiesNS, "--replicas=1")
	draining := h.drainOne(leases, nil)
	m, err = h.leaderMetrics(in)
	require.NoError(t, err)
	assert.Equal(t, errorsBefore, m["proxy_operator_leaseview_poll_errors_total"], "the controller reads leases from the TLS brokers")
	for id, l := range leases {
		if id != draining {
			require.NoError(t, l.Release(context.Background()))
		}
	}
}

// diagnose prints what a failed run needs to be understood.
func (h *harness) diagnose() {
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide"},
		{"get", "proxies,proxypools", "-A"},
		{"get", "events", "-A", "--sort-by=.lastTimestamp"},
	} {
		out, err := h.kubectlOut(args...)
		fmt.Printf("e2e-cluster: kubectl %s:\n%s%v\n", strings.Join(args, " "), out, orEmpty(err))
	}
	for _, ns := range []string{"ep-e2e", "ep-e2e-tls"} {
		for _, c := range []string{"controller", "prober", "broker", "redis"} {
			out, _ := h.kubectlOut("logs", "-n", ns, "-l", "app.kubernetes.io/component="+c, "--tail=40", "--prefix", "--all-containers")
			if out != "" {
				fmt.Printf("e2e-cluster: %s %s logs:\n%s\n", ns, c, out)
			}
		}
	}
	_ = os.Stdout.Sync()
}

func orEmpty(err error) any {
	if err == nil {
		return ""
	}
	return err
}
