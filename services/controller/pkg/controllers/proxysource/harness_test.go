package proxysource_test

import (
	"context"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/lifecycle"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxysource"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// leases is the lease view the tests set by hand, in place of the
// broker's (the end-to-end suite runs the real one).
type leases struct {
	mu sync.Mutex
	m  map[string]int32
}

func (l *leases) Snapshot() leaseview.Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return leaseview.Snapshot{At: time.Now(), Leases: maps.Clone(l.m)}
}

func (l *leases) set(id string, n int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[id] = n
}

// harness runs the Proxy lifecycle (External members turn Ready at their
// address) and the ProxySource reconciler on the shared API server, in a
// namespace of its own; a stand-in prober marks every Ready member
// Healthy.
type harness struct {
	t      *testing.T
	ns     string
	leases *leases
	opts   proxysource.Options
	stop   func()
}

func start(t *testing.T, egress netpolicy.Egress) *harness {
	return startWith(t, proxysource.Options{Egress: egress})
}

func startWith(t *testing.T, opts proxysource.Options) *harness {
	testenv.Require(t)
	opts.MarkLag = 200 * time.Millisecond
	h := &harness{t: t, ns: env.Namespace(t, "source"), leases: &leases{m: map[string]int32{}}, opts: opts}
	h.run()
	return h
}

// run starts a manager with the lifecycle and source reconcilers, until
// stop or the test's end.
func (h *harness) run() {
	t := h.t
	ctx, cancel := context.WithCancel(context.Background())
	mgr := env.Manager(t, h.ns, nil)
	reg, err := providers.NewRegistry(ctx, nil, nil, providers.Deps{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Log: slog.Default()})
	require.NoError(t, err)
	require.NoError(t, lifecycle.New(mgr.GetClient(), reg, mgr.GetEventRecorder("test"), slog.Default(), lifecycle.Options{
		PollInterval: 100 * time.Millisecond, ResyncInterval: time.Hour, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
	}).SetupWithManager(ctx, mgr))
	require.NoError(t, proxysource.New(mgr.GetClient(), mgr.GetCache(), h.leases, mgr.GetEventRecorder("test"), slog.Default(), h.opts).SetupWithManager(mgr))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	go h.prober(ctx)
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
}

// prober marks Ready members Healthy, as the probe fleet would.
func (h *harness) prober(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var list v1.ProxyList
		if err := env.Client.List(ctx, &list, client.InNamespace(h.ns)); err == nil {
			for _, px := range list.Items {
				if !px.IsReady() || px.Status.Healthy || !px.DeletionTimestamp.IsZero() {
					continue
				}
				px.Status.Healthy, px.Status.HealthInstanceGeneration = true, px.Status.InstanceGeneration
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded, Message: "stand-in"})
				_ = env.Client.Status().Update(ctx, &px)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (h *harness) create(objs ...client.Object) {
	h.t.Helper()
	for _, o := range objs {
		o.SetNamespace(h.ns)
		require.NoError(h.t, env.Client.Create(context.Background(), o))
	}
}

func (h *harness) source(name string, spec v1.ProxySourceSpec) *v1.ProxySource {
	s := &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	h.create(s)
	return s
}

func (h *harness) get(name string) *v1.ProxySource {
	h.t.Helper()
	s := &v1.ProxySource{}
	require.NoError(h.t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, s))
	return s
}

// members are the source's Proxies, by the entry they were made for.
func (h *harness) members(name string) map[string]*v1.Proxy {
	var list v1.ProxyList
	require.NoError(h.t, env.Client.List(context.Background(), &list, client.InNamespace(h.ns), client.MatchingLabels{v1.LabelSource: name}))
	out := map[string]*v1.Proxy{}
	for i := range list.Items {
		out[list.Items[i].Annotations[v1.AnnotationSourceEntry]] = &list.Items[i]
	}
	return out
}

// refresh has the source fetch its URL again now.
func (h *harness) refresh(name string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		s := h.get(name)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[v1.AnnotationRefresh] = time.Now().Format(time.RFC3339Nano)
		return env.Client.Update(context.Background(), s) == nil
	}, 10*time.Second, 20*time.Millisecond)
}

// waitFor waits until the source's status satisfies ok, and returns it.
func (h *harness) waitFor(name, what string, ok func(*v1.ProxySource) bool) *v1.ProxySource {
	h.t.Helper()
	var s *v1.ProxySource
	if !assert.Eventually(h.t, func() bool { s = h.get(name); return ok(s) }, 30*time.Second, 50*time.Millisecond) {
		var list v1.ProxyList
		_ = env.Client.List(context.Background(), &list, client.InNamespace(h.ns))
		for _, px := range list.Items {
			h.t.Logf("member %s %v: %+v", px.Name, px.Annotations, px.Status)
		}
		h.t.Fatalf("source %s never became %s: %+v", name, what, s.Status)
	}
	return s
}

func cond(s *v1.ProxySource, typ string) *metav1.Condition {
	return meta.FindStatusCondition(s.Status.Conditions, typ)
}

func synced(reason string) func(*v1.ProxySource) bool {
	return func(s *v1.ProxySource) bool {
		c := cond(s, v1.ConditionSynced)
		return c != nil && c.Reason == reason && c.ObservedGeneration == s.Generation
	}
}

func ready(desired int32) func(*v1.ProxySource) bool {
	return func(s *v1.ProxySource) bool {
		return s.Status.Desired == desired && s.Status.Healthy == desired && s.Status.Present == desired && meta.IsStatusConditionTrue(s.Status.Conditions, v1.ConditionReady)
	}
}

func listMap(data string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "list", Labels: map[string]string{v1.LabelProxySource: "true"}},
		Data: map[string]string{"proxies": data}}
}

func identities(m map[string]*v1.Proxy) []string {
	return slices.Sorted(maps.Keys(m))
}
