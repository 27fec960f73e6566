package lifecycle_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/kubelet"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/lifecycle"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/fake"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/gcp"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/gcp/fakecompute"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kubernetes"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// harness is one manager running the lifecycle reconciler against the
// shared API server, confined to a namespace of its own. Entries:
// "kubernetes" (the real provider, pods in the same namespace) and "fake".
type harness struct {
	t    *testing.T
	ns   string
	fake *fake.Provider
	// wrap, when set before start, wraps the kubernetes provider.
	wrap func(providers.Provider) providers.Provider
	stop func()
	// kubelet runs the provider's pods (an address each, no Squid).
	kubelet *kubelet.StandIn
	// compute, when set before start, backs a "gcp" entry.
	compute *fakecompute.Server
	// kvm2, when set before start, is the block of a "kvm-home" entry of
	// type kvm2.
	kvm2 []byte
	// opts, changed before start, are the reconciler's options.
	opts lifecycle.Options
}

func newHarness(t *testing.T) *harness {
	testenv.Require(t)
	ns := env.Namespace(t, "lc")
	return &harness{t: t, ns: ns, fake: fake.New("fake"), kubelet: &kubelet.StandIn{Client: env.Client, Namespace: ns, T: t, AddressOnly: true}, opts: lifecycle.Options{
		PollInterval: 100 * time.Millisecond, ResyncInterval: time.Hour, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
	}}
}

func (h *harness) start() *harness {
	t := h.t
	ctx, cancel := context.WithCancel(context.Background())
	mgr := env.Manager(t, h.ns, lifecycle.CacheByObject(nil))
	factories := map[string]providers.Factory{
		kubernetes.Type: func(ctx context.Context, e providers.Entry, d providers.Deps) (providers.Provider, error) {
			p, err := kubernetes.New(ctx, e, d)
			if err == nil && h.wrap != nil {
				p = h.wrap(p)
			}
			return p, err
		},
		"fake":    h.fake.Factory(),
		gcp.Type:  gcp.New,
		kvm.Type2: kvm.New2,
	}
	cfg := fmt.Sprintf("providers:\n- {name: kubernetes, type: kubernetes, kubernetes: {namespace: %s, allowedImages: [example/squid:2]}}\n- {name: fake, type: fake}\n", h.ns)
	if h.compute != nil {
		cfg += fmt.Sprintf("- {name: gcp-eu, type: gcp, gcp: {project: p, endpoint: %q, withoutAuthentication: true}}\n", h.compute.URL)
	}
	if h.kvm2 != nil {
		cfg += fmt.Sprintf("- {name: kvm-home, type: kvm2, kvm2: %s}\n", h.kvm2)
	}
	entries, err := providers.ParseConfig([]byte(cfg), []string{"kubernetes", "fake", gcp.Type, kvm.Type2})
	require.NoError(t, err)
	reg, err := providers.NewRegistry(ctx, entries, factories, providers.Deps{
		Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Log: slog.Default(),
	})
	require.NoError(t, err)
	rec := lifecycle.New(mgr.GetClient(), reg, mgr.GetEventRecorder("egress-proxies-controller"), slog.Default(), h.opts)
	require.NoError(t, rec.SetupWithManager(ctx, mgr))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			require.NoError(t, <-done)
		})
	}
	t.Cleanup(h.stop)
	return h
}

// restart stops the manager and starts a new one, as a crash or a new
// pod with a changed providers config would.
func (h *harness) restart() {
	h.stop()
	h.start()
}

func (h *harness) managed(name, provider string) *v1.Proxy {
	return &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: provider, Port: 3128,
			Attributes: map[string]string{"geo": "eu"}},
	}
}

func (h *harness) external(name, address string, port int32) *v1.Proxy {
	return &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: h.ns},
		Spec:       v1.ProxySpec{Mode: v1.ModeExternal, Address: address, Port: port},
	}
}

func (h *harness) create(px *v1.Proxy) *v1.Proxy {
	require.NoError(h.t, env.Client.Create(context.Background(), px))
	return px
}

func (h *harness) get(name string) *v1.Proxy {
	px := &v1.Proxy{}
	require.NoError(h.t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, px))
	return px
}

// waitFor polls the Proxy until ok, failing with the last status seen.
func (h *harness) waitFor(name, what string, ok func(*v1.Proxy) bool) *v1.Proxy {
	h.t.Helper()
	var last *v1.Proxy
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		px := &v1.Proxy{}
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, px)
		if err == nil {
			last = px
			if ok(px) {
				return px
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	h.t.Fatalf("proxy %s never became %s; last status: %+v", name, what, last)
	return nil
}

func (h *harness) waitGone(name string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, &v1.Proxy{})
		return apierrors.IsNotFound(err)
	}, 30*time.Second, 50*time.Millisecond, "proxy %s was never released", name)
}

func (h *harness) pods() []corev1.Pod {
	list := &corev1.PodList{}
	require.NoError(h.t, env.Client.List(context.Background(), list, client.InNamespace(h.ns)))
	return list.Items
}

// waitReady runs the kubelet stand-in until the Proxy is Ready.
func (h *harness) waitReady(name string) *v1.Proxy {
	h.t.Helper()
	return h.waitFor(name, "Ready", func(px *v1.Proxy) bool {
		h.kubelet.Sync(context.Background())
		return px.Status.Phase == v1.PhaseReady && px.Status.IP != ""
	})
}

func (h *harness) events(name string) []eventsv1.Event {
	list := &eventsv1.EventList{}
	require.NoError(h.t, env.Client.List(context.Background(), list, client.InNamespace(h.ns)))
	var out []eventsv1.Event
	for _, e := range list.Items {
		if e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

func (h *harness) waitEvent(name, reason string) eventsv1.Event {
	h.t.Helper()
	var found eventsv1.Event
	require.Eventually(h.t, func() bool {
		for _, e := range h.events(name) {
			if e.Reason == reason {
				found = e
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "no %s event for %s", reason, name)
	return found
}

func (h *harness) update(name string, mutate func(*v1.Proxy)) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		px := h.get(name)
		mutate(px)
		return env.Client.Update(context.Background(), px) == nil
	}, 10*time.Second, 50*time.Millisecond)
}

// steady returns count's value once it has not changed for 300 ms (three
// backoff bases of the harness: a retry loop never rests that long before
// its delays grow past it, and then the caller's longer watch sees it).
func steady(t *testing.T, count func() int) int {
	t.Helper()
	last, since := count(), time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for time.Since(since) < 300*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatalf("still changing after 30s (at %d)", last)
		}
		time.Sleep(20 * time.Millisecond)
		if n := count(); n != last {
			last, since = n, time.Now()
		}
	}
	return last
}
