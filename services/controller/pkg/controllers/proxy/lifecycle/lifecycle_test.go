package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/metrics"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

func ready(px *v1.Proxy) *metav1.Condition {
	return meta.FindStatusCondition(px.Status.Conditions, v1.ConditionReady)
}

func TestManagedHappyPath(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.managed("eu-1", "kubernetes"))
	px := h.waitReady("eu-1")

	pods := h.pods()
	require.Len(t, pods, 1)
	assert.Equal(t, providers.InstanceName("eu-1", px.UID, 1), pods[0].Name, "deterministic instance name")
	assert.Equal(t, pods[0].Status.PodIP, px.Status.IP)
	assert.Equal(t, int32(3128), px.Status.Port)
	assert.Equal(t, "kubernetes://"+h.ns+"/"+pods[0].Name, px.Status.ProviderID)
	assert.Equal(t, int64(1), px.Status.InstanceGeneration)
	assert.NotEmpty(t, px.Status.SpecHash)
	assert.Equal(t, px.Generation, px.Status.ObservedGeneration)
	assert.Contains(t, px.Finalizers, v1.Finalizer)
	assert.Equal(t, metav1.ConditionTrue, ready(px).Status)
	assert.Equal(t, v1.ReasonRunning, ready(px).Reason)
	assert.Nil(t, meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy), "health is the health engine's to write, on its first verdict")
	assert.False(t, px.Status.IsHealthy())
	h.waitEvent("eu-1", v1.ReasonProvisioning)
	h.waitEvent("eu-1", v1.ReasonRunning)

	// Deleting the Proxy deletes its pod first.
	require.NoError(t, env.Client.Delete(context.Background(), px))
	h.waitGone("eu-1")
	assert.Empty(t, h.pods(), "the finalizer deleted the pod")
}

func TestExternalIsTrackedNotProvisioned(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.external("ext", "127.0.0.55", 8080))
	px := h.waitFor("ext", "Ready", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseReady })
	assert.Equal(t, "127.0.0.55", px.Status.IP)
	assert.Equal(t, int32(8080), px.Status.Port)
	assert.Equal(t, v1.ReasonTracking, ready(px).Reason)
	assert.Empty(t, px.Finalizers, "nothing to clean up")
	assert.Empty(t, h.pods())
	assert.Zero(t, h.fake.Calls("Create"))
	// Events go out asynchronously: one emitted after ext's transition,
	// once seen, means ext's would have been seen too.
	h.create(h.managed("later", "fake"))
	h.waitEvent("later", v1.ReasonRunning)
	events := &eventsv1.EventList{}
	require.NoError(t, env.Client.List(context.Background(), events, client.InNamespace(h.ns)))
	for _, ev := range events.Items {
		assert.NotEqual(t, "ext", ev.Regarding.Name, "tracking an External proxy is not an Event: %s %s", ev.Reason, ev.Note)
	}
}

// An External Proxy moved to another address is a new instance: its
// generation moves in the same write that moves it, so the old address's
// Healthy=True no longer makes it leasable. The lifecycle leaves the
// health fields to the health engine, which resets them (package health).
func TestExternalAddressChangeIsANewInstance(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.external("moved", "127.0.0.56", 8080))
	px := h.waitFor("moved", "Ready", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseReady })
	require.Equal(t, int64(1), px.Status.InstanceGeneration)
	// What the health engine writes once the old address is proven.
	px.Status.Healthy, px.Status.EgressIP, px.Status.HealthInstanceGeneration = true, "198.51.100.9", 1
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded, Message: "ok"})
	require.NoError(t, env.Client.Status().Update(context.Background(), px))
	require.True(t, px.Status.IsHealthy())

	for i, tc := range []struct {
		name   string
		mutate func(*v1.Proxy)
		want   string
	}{
		{"address", func(px *v1.Proxy) { px.Spec.Address = "127.0.0.57" }, "127.0.0.57:8080"},
		{"port", func(px *v1.Proxy) { px.Spec.Port = 8081 }, "127.0.0.57:8081"},
	} {
		h.update("moved", tc.mutate)
		got := h.waitFor("moved", tc.name+" moved", func(px *v1.Proxy) bool {
			return fmt.Sprintf("%s:%d", px.Status.IP, px.Status.Port) == tc.want
		})
		assert.Equal(t, int64(2+i), got.Status.InstanceGeneration, "%s change", tc.name)
		assert.False(t, got.Status.IsHealthy(), "not leasable until the new address is proven")
		assert.True(t, got.Status.Healthy, "the health fields are the engine's to reset, not the lifecycle's")
	}
}

func TestReplacementOnEveryImmutableField(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*v1.Proxy)
	}{
		{"placement", func(px *v1.Proxy) { px.Spec.Placement = &v1.Placement{Image: "example/squid:2"} }},
		{"cloudInit", func(px *v1.Proxy) { px.Spec.CloudInit = &v1.CloudInit{Inline: "#cloud-config\npackages: [squid]\n"} }},
		{"port", func(px *v1.Proxy) { px.Spec.Port = 8080 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t).start()
			h.create(h.managed("r", "kubernetes"))
			before := h.waitReady("r")
			oldPod := h.pods()[0].Name

			h.update("r", tc.mutate)
			h.waitEvent("r", v1.ReasonReplacing)
			after := h.waitFor("r", "Ready as generation 2", func(px *v1.Proxy) bool {
				h.kubelet.Sync(context.Background())
				return px.Status.InstanceGeneration == 2 && px.Status.Phase == v1.PhaseReady
			})
			pods := h.pods()
			require.Len(t, pods, 1, "the old instance is gone and exactly one new one exists")
			assert.NotEqual(t, oldPod, pods[0].Name)
			assert.Equal(t, providers.InstanceName("r", before.UID, 2), pods[0].Name)
			assert.NotEqual(t, before.Status.IP, after.Status.IP, "a replacement has a new IP")
			assert.Equal(t, before.Name, after.Name)
			assert.NotEqual(t, before.Status.SpecHash, after.Status.SpecHash)
		})
	}
}

func TestSecretRotationReplacesAndUnlabelledSecretIsInvisible(t *testing.T) {
	h := newHarness(t).start()
	ctx := context.Background()
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "boot", Namespace: h.ns},
		Data:       map[string][]byte{"user-data": []byte("#cloud-config\n# v1\n")},
	}
	require.NoError(t, env.Client.Create(ctx, sec))
	px := h.managed("s", "kubernetes")
	px.Spec.CloudInit = &v1.CloudInit{SecretRef: &v1.SecretKeyRef{Name: "boot"}}
	h.create(px)

	failed := h.waitFor("s", "CloudInitError", func(px *v1.Proxy) bool {
		c := ready(px)
		return c != nil && c.Reason == v1.ReasonCloudInitError
	})
	assert.Equal(t, v1.PhaseFailed, failed.Status.Phase)
	assert.Contains(t, ready(failed).Message, h.ns+"/boot")
	assert.Contains(t, ready(failed).Message, v1.LabelCloudInit)
	assert.Empty(t, h.pods(), "nothing is created from an invisible Secret")

	// Labelling the Secret makes it visible; the watch brings the Proxy back.
	sec.Labels = map[string]string{v1.LabelCloudInit: "true"}
	require.NoError(t, env.Client.Update(ctx, sec))
	first := h.waitReady("s")
	require.Equal(t, int64(1), first.Status.InstanceGeneration)

	// Rotating the content replaces the instance.
	sec.Data["user-data"] = []byte("#cloud-config\n# v2\n")
	require.NoError(t, env.Client.Update(ctx, sec))
	second := h.waitFor("s", "replaced", func(px *v1.Proxy) bool {
		h.kubelet.Sync(context.Background())
		return px.Status.InstanceGeneration == 2 && px.Status.Phase == v1.PhaseReady
	})
	assert.NotEqual(t, first.Status.IP, second.Status.IP)
	assert.Len(t, h.pods(), 1)
}

func TestAttributesDoNotReplace(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.managed("a", "kubernetes"))
	before := h.waitReady("a")
	h.update("a", func(px *v1.Proxy) { px.Spec.Attributes["tier"] = "gold" })
	after := h.waitFor("a", "observed", func(px *v1.Proxy) bool {
		return px.Status.ObservedGeneration == px.Generation && px.Generation > before.Generation
	})
	assert.Equal(t, int64(1), after.Status.InstanceGeneration)
	assert.Equal(t, before.Status.ProviderID, after.Status.ProviderID)
	assert.Equal(t, before.Status.IP, after.Status.IP)
	assert.Equal(t, v1.PhaseReady, after.Status.Phase)
	assert.Len(t, h.pods(), 1)
}

// crashAfterCreate creates the instance for real, then fails the call, as
// a controller that dies before its status write would look to the next
// reconcile.
type crashAfterCreate struct {
	providers.Provider
	mu     sync.Mutex
	failed int
	times  int
}

func (c *crashAfterCreate) Create(ctx context.Context, req *providers.CreateRequest) (*providers.Instance, error) {
	inst, err := c.Provider.Create(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.failed < c.times {
		c.failed++
		return nil, errors.New("connection reset after create")
	}
	return inst, err
}

func TestCrashAfterCreateMakesExactlyOneInstance(t *testing.T) {
	h := newHarness(t)
	crash := &crashAfterCreate{times: 3}
	h.wrap = func(p providers.Provider) providers.Provider { crash.Provider = p; return crash }
	h.start()
	h.create(h.managed("c", "kubernetes"))
	px := h.waitReady("c")
	assert.Equal(t, 3, crash.failed, "every lost answer was retried")
	pods := h.pods()
	require.Len(t, pods, 1, "retried creates never make a second instance")
	assert.Equal(t, "kubernetes://"+h.ns+"/"+pods[0].Name, px.Status.ProviderID)
}

// blockAfterCreate lets the first Create reach the backend and then never
// answers, so the test can stop the manager between create and status
// write.
type blockAfterCreate struct {
	providers.Provider
	created, release chan struct{}
	once             sync.Once
}

func (b *blockAfterCreate) Create(ctx context.Context, req *providers.CreateRequest) (*providers.Instance, error) {
	inst, err := b.Provider.Create(ctx, req)
	first := false
	b.once.Do(func() { first = true; close(b.created) })
	if first {
		<-b.release
		return nil, errors.New("process killed before the answer arrived")
	}
	return inst, err
}

func TestManagerStoppedBetweenCreateAndStatusWrite(t *testing.T) {
	h := newHarness(t)
	block := &blockAfterCreate{created: make(chan struct{}), release: make(chan struct{})}
	h.wrap = func(p providers.Provider) providers.Provider { block.Provider = p; return block }
	h.start()
	h.create(h.managed("m", "kubernetes"))
	select {
	case <-block.created:
	case <-time.After(30 * time.Second):
		t.Fatal("create never happened")
	}
	require.Len(t, h.pods(), 1)
	assert.Empty(t, h.get("m").Status.ProviderID, "the status write never happened")

	// Stop the manager; it waits for the in-flight reconcile, which the
	// release lets fail as a killed process's would.
	stopped := make(chan struct{})
	go func() { h.stop(); close(stopped) }()
	close(block.release)
	<-stopped
	h.wrap = nil
	h.start()
	px := h.waitReady("m")
	pods := h.pods()
	require.Len(t, pods, 1, "the restarted controller adopted the instance instead of making another")
	assert.Equal(t, "kubernetes://"+h.ns+"/"+pods[0].Name, px.Status.ProviderID)
}

func TestMissingPlacementFieldIsNamedAndNotRetried(t *testing.T) {
	h := newHarness(t)
	h.fake.RequirePlacement = []string{"zone", "machineType"}
	h.start()
	px := h.managed("p", "fake")
	px.Spec.Placement = &v1.Placement{Zone: "z1"}
	h.create(px)
	failed := h.waitFor("p", "Failed", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseFailed })
	assert.Equal(t, v1.ReasonInvalidPlacement, ready(failed).Reason)
	assert.Contains(t, ready(failed).Message, "spec.placement.machineType")
	// Reconciles already queued (the finalizer's own update) may still
	// call Create, later on a busy machine: wait for the calls to settle,
	// then watch ten backoff bases, in which a retry loop would show.
	calls := steady(t, func() int { return h.fake.Calls("Create") })
	time.Sleep(time.Second)
	assert.Equal(t, calls, h.fake.Calls("Create"), "a config error is not retried")

	h.update("p", func(px *v1.Proxy) { px.Spec.Placement.MachineType = "small" })
	h.waitFor("p", "Ready after the fix", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseReady })
}

func TestQuotaWaitsAndRetriesInsteadOfFailing(t *testing.T) {
	h := newHarness(t)
	var mu sync.Mutex
	remaining := 3
	h.fake.CreateErr = func(*providers.CreateRequest) error {
		mu.Lock()
		defer mu.Unlock()
		if remaining > 0 {
			remaining--
			return providers.NewQuota(errors.New("QUOTA_EXCEEDED: CPUS"))
		}
		return nil
	}
	h.start()
	h.create(h.managed("q", "fake"))
	waiting := h.waitFor("q", "waiting for quota", func(px *v1.Proxy) bool {
		c := ready(px)
		return c != nil && c.Reason == v1.ReasonQuotaExceeded
	})
	assert.Equal(t, v1.PhaseProvisioning, waiting.Status.Phase, "quota is a wait, not Failed")
	assert.Contains(t, ready(waiting).Message, "QUOTA_EXCEEDED")
	h.waitFor("q", "Ready", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseReady })
	assert.Equal(t, 1, h.fake.Len())
}

func TestUnknownProviderIsNamed(t *testing.T) {
	h := newHarness(t).start()
	h.create(h.managed("u", "gcp-mars"))
	px := h.waitFor("u", "Failed", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseFailed })
	assert.Equal(t, v1.ReasonUnknownProvider, ready(px).Reason)
	assert.Contains(t, ready(px).Message, `"gcp-mars"`)
	assert.Contains(t, ready(px).Message, "fake, kubernetes")
}

func TestFailingCleanupStaysTerminatingUntilSkipCleanup(t *testing.T) {
	h := newHarness(t)
	h.start()
	h.create(h.managed("d", "fake"))
	px := h.waitFor("d", "Ready", func(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseReady })
	h.fake.DeleteErr = func() error { return errors.New("403 Forbidden: credentials revoked") }

	require.NoError(t, env.Client.Delete(context.Background(), px))
	stuck := h.waitFor("d", "CleanupFailed", func(px *v1.Proxy) bool {
		c := ready(px)
		return c != nil && c.Reason == v1.ReasonCleanupFailed
	})
	assert.Equal(t, v1.PhaseDeleting, stuck.Status.Phase)
	assert.Contains(t, ready(stuck).Message, "credentials revoked")
	assert.Contains(t, ready(stuck).Message, v1.AnnotationSkipCleanup)
	assert.Equal(t, 1, h.fake.Len())

	h.update("d", func(px *v1.Proxy) {
		if px.Annotations == nil {
			px.Annotations = map[string]string{}
		}
		px.Annotations[v1.AnnotationSkipCleanup] = "true"
	})
	h.waitGone("d")
	ev := h.waitEvent("d", "CleanupSkipped")
	assert.Equal(t, corev1.EventTypeWarning, ev.Type)
	assert.Contains(t, ev.Note, px.Status.ProviderID, "the event names what was left running")
	assert.Equal(t, 1, h.fake.Len(), "the instance was abandoned, not deleted")
}

// countingGets counts provider reads so the test can prove resyncs happened.
type countingGets struct {
	providers.Provider
	mu   sync.Mutex
	gets int
}

func (c *countingGets) Get(ctx context.Context, id string) (*providers.Instance, error) {
	c.mu.Lock()
	c.gets++
	c.mu.Unlock()
	return c.Provider.Get(ctx, id)
}

func (c *countingGets) n() int { c.mu.Lock(); defer c.mu.Unlock(); return c.gets }

func TestSteadyProxyCausesNoStatusWrites(t *testing.T) {
	h := newHarness(t)
	counter := &countingGets{}
	h.wrap = func(p providers.Provider) providers.Provider { counter.Provider = p; return counter }
	h.start()
	h.create(h.managed("steady", "kubernetes"))
	px := h.waitReady("steady")
	writes := testutil.ToFloat64(metrics.StatusWrites.WithLabelValues("lifecycle"))

	// Annotation changes reconcile without touching the spec: each one is
	// a full reconcile of a steady Proxy, provider Get included. Each poke
	// waits for its own reconcile: the work queue folds updates of one key
	// that arrive while it is busy into one reconcile.
	start := counter.n()
	for i := range 10 {
		before := counter.n()
		h.update("steady", func(px *v1.Proxy) {
			if px.Annotations == nil {
				px.Annotations = map[string]string{}
			}
			px.Annotations["test/poke"] = string(rune('a' + i))
		})
		require.Eventually(t, func() bool { return counter.n() > before }, 30*time.Second, 10*time.Millisecond, "poke %d was not reconciled", i)
	}

	after := h.get("steady")
	assert.Equal(t, px.Status, after.Status, "status unchanged")
	assert.Equal(t, writes, testutil.ToFloat64(metrics.StatusWrites.WithLabelValues("lifecycle")), "no status write in %d reconciles", counter.n()-start)
}
