package proxypool_test

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/kubelet"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/lifecycle"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxypool"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxypool/autoscaler"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/fake"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kubernetes"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// leases is the lease source the tests set by hand, in place of the
// broker (the end-to-end suite runs the real one).
type leases struct {
	mu       sync.Mutex
	m        map[string]int32
	refusals []leaseview.Refusal
	wakeups  *proxypool.Wakeups
	scaling  *leaseview.Wake
}

func (l *leases) Snapshot() leaseview.Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return leaseview.Snapshot{At: time.Now(), Leases: maps.Clone(l.m), Refusals: l.refusals}
}

// poll wakes the pools that follow polls, as each poll of the broker
// does.
func (l *leases) poll() {
	l.mu.Lock()
	w, s := l.wakeups, l.scaling
	l.mu.Unlock()
	if w != nil {
		w.Polled()
		s.Polled()
	}
}

// refuse sets the refusals the broker reports and wakes the pools, as a
// poll does.
func (l *leases) refuse(rs ...leaseview.Refusal) {
	l.mu.Lock()
	l.refusals = rs
	l.mu.Unlock()
	l.poll()
}

func (l *leases) set(id string, n int32) {
	l.mu.Lock()
	l.m[id] = n
	w := l.wakeups
	l.mu.Unlock()
	if w != nil {
		w.LeasesChanged([]string{id})
	}
}

// harness runs the Proxy lifecycle reconciler (the kubernetes provider,
// pods given addresses by the stand-in kubelet) and the ProxyPool
// reconciler on the shared API server, in a namespace of its own. A
// stand-in prober marks every Ready member Healthy.
type harness struct {
	t       testing.TB
	ns      string
	leases  *leases
	kubelet *kubelet.StandIn
	// wrap, when set before start, wraps the pool reconciler's client.
	wrap func(c client.Client, kill func()) client.Client
	// kill stops the running manager without waiting (callable from
	// inside a reconcile); done is closed once it has stopped.
	kill func()
	done chan struct{}
	// fake backs the "fake" provider entry, for injected failures.
	fake *fake.Provider
	// opts, changed before start, are the pool reconciler's: quick by
	// default, so tests do not wait on production's batching.
	opts proxypool.Options

	// What the stand-in prober reports: sick members are unhealthy, and
	// egress gives a Ready member's egress IP ("" for none).
	mu     sync.Mutex
	sick   map[string]bool
	egress func(name string) string
}

func (h *harness) setSick(names ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sick = map[string]bool{}
	for _, n := range names {
		h.sick[n] = true
	}
}

// verdict is what the stand-in prober says of px: healthy, and its egress
// IP.
func (h *harness) verdict(px *v1.Proxy) (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ip := ""
	if h.egress != nil {
		ip = h.egress(px.Name)
	}
	return !h.sick[px.Name], ip
}

func newHarness(t testing.TB) *harness {
	testenv.Require(t)
	ns := env.Namespace(t, "pool")
	return &harness{t: t, ns: ns, leases: &leases{m: map[string]int32{}}, fake: fake.New("fake"),
		opts:    proxypool.Options{MarkLag: 200 * time.Millisecond, MemberBatch: 100 * time.Millisecond},
		kubelet: &kubelet.StandIn{Client: env.Client, Namespace: ns, T: t, AddressOnly: true}}
}

func (h *harness) start() *harness {
	t := h.t
	ctx, cancel := context.WithCancel(context.Background())
	mgr := env.Manager(t, h.ns, lifecycle.CacheByObject(nil))
	entries, err := providers.ParseConfig([]byte(fmt.Sprintf("providers:\n- {name: kubernetes, type: kubernetes, kubernetes: {namespace: %s}}\n- {name: fake, type: fake}\n", h.ns)), []string{kubernetes.Type, "fake"})
	require.NoError(t, err)
	reg, err := providers.NewRegistry(ctx, entries, map[string]providers.Factory{kubernetes.Type: kubernetes.New, "fake": h.fake.Factory()}, providers.Deps{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Log: slog.Default(),
	})
	require.NoError(t, err)
	lc := lifecycle.New(mgr.GetClient(), reg, mgr.GetEventRecorder("egress-proxies-controller"), slog.Default(), lifecycle.Options{
		PollInterval: 100 * time.Millisecond, ResyncInterval: time.Hour, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
	})
	require.NoError(t, lc.SetupWithManager(ctx, mgr))
	c := mgr.GetClient()
	if h.wrap != nil {
		c = h.wrap(c, cancel)
	}
	wakeups := proxypool.NewWakeups(mgr.GetClient())
	recorder := mgr.GetEventRecorder("egress-proxies-controller")
	require.NoError(t, proxypool.New(c, h.leases, wakeups, recorder, slog.Default(), h.opts).SetupWithManager(mgr))
	scaling := leaseview.NewWake()
	require.NoError(t, autoscaler.New(c, h.leases, scaling, recorder, nil).SetupWithManager(mgr))
	h.leases.mu.Lock()
	h.leases.wakeups, h.leases.scaling = wakeups, scaling
	h.leases.mu.Unlock()
	done := make(chan struct{})
	killed := h.wrap != nil
	go func() {
		defer close(done)
		err := mgr.Start(ctx)
		switch {
		case err != nil && killed:
			// A killed process has no shutdown to wait for: what matters
			// is what the next manager finds, not how this one ended.
			t.Logf("the killed manager ended with: %v", err)
		case err != nil:
			t.Errorf("manager: %v", err)
		}
	}()
	go h.standIns(ctx)
	h.kill, h.done = cancel, done
	t.Cleanup(func() { cancel(); <-done })
	return h
}

// restart waits for the stopped (or killed) manager and starts another.
func (h *harness) restart() {
	h.kill()
	<-h.done
	h.start()
}

// standIns gives pods addresses, marks Ready members Healthy and wakes
// autoscaled pools as the lease poller would, until ctx ends.
func (h *harness) standIns(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		h.kubelet.Sync(ctx)
		h.leases.poll()
		list := &v1.ProxyList{}
		if err := env.Client.List(ctx, list, client.InNamespace(h.ns)); err == nil {
			for _, px := range list.Items {
				if !meta.IsStatusConditionTrue(px.Status.Conditions, v1.ConditionReady) || !px.DeletionTimestamp.IsZero() {
					continue
				}
				healthy, ip := h.verdict(&px)
				if px.Status.Healthy == healthy && px.Status.EgressIP == ip && px.Status.HealthInstanceGeneration == px.Status.InstanceGeneration {
					continue
				}
				px.Status.Healthy, px.Status.EgressIP, px.Status.HealthInstanceGeneration = healthy, ip, px.Status.InstanceGeneration
				c := metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded, Message: "the test's stand-in prober"}
				if !healthy {
					c.Status, c.Reason = metav1.ConditionFalse, v1.ReasonProbeFailed
				}
				meta.SetStatusCondition(&px.Status.Conditions, c)
				_ = env.Client.Status().Update(ctx, &px) // a conflict is retried next tick
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (h *harness) pool(name string, replicas int32) *v1.ProxyPool {
	return &v1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: v1.ProxyPoolSpec{
			Replicas: ptr.To(replicas),
			Template: v1.ProxyTemplate{
				Metadata: v1.ProxyTemplateMeta{Labels: map[string]string{"team": "crawl"}},
				Spec:     v1.ProxyTemplateSpec{Provider: "kubernetes", Port: 3128, Attributes: map[string]string{"geo": "eu"}},
			},
		},
	}
}

func (h *harness) create(p *v1.ProxyPool) *v1.ProxyPool {
	h.t.Helper()
	require.NoError(h.t, env.Client.Create(context.Background(), p))
	return p
}

func (h *harness) get(name string) *v1.ProxyPool {
	h.t.Helper()
	p := &v1.ProxyPool{}
	require.NoError(h.t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, p))
	return p
}

func (h *harness) update(name string, mutate func(*v1.ProxyPool)) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		p := h.get(name)
		mutate(p)
		return env.Client.Update(context.Background(), p) == nil
	}, 10*time.Second, 20*time.Millisecond)
}

// members lists the Proxies of the namespace not being deleted.
func (h *harness) members() []v1.Proxy {
	h.t.Helper()
	list := &v1.ProxyList{}
	require.NoError(h.t, env.Client.List(context.Background(), list, client.InNamespace(h.ns)))
	var out []v1.Proxy
	for _, px := range list.Items {
		if px.DeletionTimestamp.IsZero() {
			out = append(out, px)
		}
	}
	return out
}

func (h *harness) proxy(name string) (*v1.Proxy, error) {
	px := &v1.Proxy{}
	return px, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, px)
}

// waitSteady waits until the pool reports want members, all up to date
// and healthy, and its Ready condition is True.
func (h *harness) waitSteady(name string, want int32) *v1.ProxyPool {
	h.t.Helper()
	var last *v1.ProxyPool
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		p := h.get(name)
		last = p
		st := p.Status
		if st.ObservedGeneration == p.Generation && st.Replicas == want && st.HealthyReplicas == want && st.UpdatedReplicas == want &&
			meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReady) && len(h.members()) == int(want) {
			return p
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Fatalf("pool %s never steady at %d members; last status: %+v; members: %d", name, want, last.Status, len(h.members()))
	return nil
}

func gone(err error) bool { return apierrors.IsNotFound(err) }

// events returns the reasons and notes of the pool's Events.
func (h *harness) events(pool string) map[string][]string {
	h.t.Helper()
	list := &eventsv1.EventList{}
	require.NoError(h.t, env.Client.List(context.Background(), list, client.InNamespace(h.ns)))
	out := map[string][]string{}
	for _, e := range list.Items {
		if e.Regarding.Kind == "ProxyPool" && e.Regarding.Name == pool {
			out[e.Reason] = append(out[e.Reason], e.Note)
		}
	}
	return out
}

// condition returns the pool's condition of type typ (zero when absent).
func (h *harness) condition(pool, typ string) metav1.Condition {
	h.t.Helper()
	if c := meta.FindStatusCondition(h.get(pool).Status.Conditions, typ); c != nil {
		return *c
	}
	return metav1.Condition{}
}

// waitEvent waits for an Event of the pool with reason whose note holds
// sub: the recorder writes Events in the background.
func (h *harness) waitEvent(pool, reason, sub string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		for _, n := range h.events(pool)[reason] {
			if strings.Contains(n, sub) {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "no %s Event of pool %s saying %q; it has %v", reason, pool, sub, h.events(pool))
}
