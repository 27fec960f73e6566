package kubernetes_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/squidconf"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/kubelet"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kubernetes"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/providertest"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func namespace(t *testing.T) string { return env.Namespace(t, "kp") }

func newProvider(t *testing.T, ns string) providers.Provider {
	t.Helper()
	p, err := kubernetes.New(context.Background(), providers.Entry{Name: "kubernetes", Type: kubernetes.Type,
		Block: []byte(fmt.Sprintf(`{"namespace":%q,"allowedImages":["example/squid:1"]}`, ns))}, providers.Deps{Client: env.Client, APIReader: env.Client})
	require.NoError(t, err)
	return p
}

func request(name string, o providers.Owner) *providers.CreateRequest {
	return &providers.CreateRequest{Name: name, Owner: o, Port: 3128}
}

// markRunning plays kubelet for one pod, at ip.
func markRunning(t *testing.T, id, ip string) {
	t.Helper()
	ns, name := splitID(t, id)
	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, pod))
	require.NoError(t, kubelet.MarkRunning(context.Background(), env.Client, pod, ip))
}

func splitID(t *testing.T, id string) (string, string) {
	t.Helper()
	ns, name, ok := strings.Cut(strings.TrimPrefix(id, "kubernetes://"), "/")
	require.True(t, ok, "bad providerID %s", id)
	return ns, name
}

func TestContract(t *testing.T) {
	testenv.Require(t)
	ns := namespace(t)
	providertest.Run(t, &providertest.Harness{
		Provider:  newProvider(t, ns),
		Request:   request,
		MakeReady: func(t *testing.T, inst *providers.Instance) { markRunning(t, inst.ProviderID, "127.0.0.9") },
		CreateUntagged: func(t *testing.T) {
			require.NoError(t, env.Client.Create(context.Background(), &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "someone-elses", Namespace: ns, Labels: map[string]string{providers.TagManagedBy: providers.ManagedByValue, providers.TagProvider: "kubernetes"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
			}))
		},
	})
}

func TestPodShape(t *testing.T) {
	testenv.Require(t)
	ns := namespace(t)
	p := newProvider(t, ns)
	o := providers.Owner{UID: uuid.NewUUID(), Namespace: "crawl", Name: "eu-1", Generation: 3}
	req := request("px-eu-1-abcdef01-3", o)
	req.Port = 8080
	req.Placement = v1.Placement{Zone: "zone-a", MachineType: "big", Image: "example/squid:1"}
	inst, err := p.Create(context.Background(), req)
	require.NoError(t, err)
	assert.Equal(t, "kubernetes://"+ns+"/px-eu-1-abcdef01-3", inst.ProviderID)

	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: req.Name}, pod))
	assert.Equal(t, map[string]string{
		providers.TagManagedBy:  "egress-proxies",
		providers.TagProvider:   "kubernetes",
		providers.TagOwnerUID:   string(o.UID),
		providers.TagGeneration: "3",
	}, pod.Labels)
	assert.Equal(t, "crawl/eu-1", pod.Annotations[providers.TagOwner])
	c := pod.Spec.Containers[0]
	assert.Equal(t, "example/squid:1", c.Image, "placement.image overrides the configured image")
	assert.Equal(t, int32(8080), c.Ports[0].ContainerPort)
	s := &corev1.Secret{}
	require.NoError(t, get(t, ns, req.Name+"-squid", s))
	assert.Contains(t, string(s.Data["squid.conf"]), "http_port 8080\n", "Squid listens on spec.port")
	assert.Equal(t, map[string]string{corev1.LabelTopologyZone: "zone-a", corev1.LabelInstanceTypeStable: "big"}, pod.Spec.NodeSelector)

	got, err := p.Get(context.Background(), inst.ProviderID)
	require.NoError(t, err)
	assert.Equal(t, providers.StatePending, got.State, "no IP yet")
	assert.Equal(t, "crawl", got.Owner.Namespace)
	assert.Equal(t, "eu-1", got.Owner.Name)

	markRunning(t, inst.ProviderID, "127.0.0.10")
	got, err = p.Get(context.Background(), inst.ProviderID)
	require.NoError(t, err)
	assert.True(t, got.Ready())
	assert.Equal(t, "127.0.0.10", got.IP)
}

// placement.image names only the entry's image or one it allows: a Proxy
// in any namespace must not run any image in the controller's namespace.
func TestPlacementImageMustBeAllowed(t *testing.T) {
	testenv.Require(t)
	ns := namespace(t)
	p := newProvider(t, ns)
	o := providers.Owner{UID: uuid.NewUUID(), Namespace: "crawl", Name: "img", Generation: 1}
	for _, tc := range []struct {
		image string
		ok    bool
	}{
		{"", true},
		{kubernetes.DefaultImage, true},
		{"example/squid:1", true},
		{"attacker/miner:latest", false},
		{"example/squid:2", false},
	} {
		req := request("img-"+strings.NewReplacer("/", "-", ":", "-", ".", "-", "_", "-").Replace(tc.image)+"x", o)
		req.Placement.Image = tc.image
		_, err := p.Create(context.Background(), req)
		if tc.ok {
			assert.NoError(t, err, tc.image)
			continue
		}
		require.Error(t, err, tc.image)
		assert.True(t, providers.IsInvalidConfig(err), "a Proxy error, not a retry: %v", err)
		assert.ErrorContains(t, err, `placement.image "`+tc.image+`" is not allowed by provider entry kubernetes`)
		assert.ErrorContains(t, err, "allowedImages")
		assert.True(t, apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: req.Name}, &corev1.Pod{})), "no pod was made for %s", tc.image)
	}
}

// A ResourceQuota that admits no more pods is the real quota answer of
// this backend; it must surface as the contract's quota kind.
func TestResourceQuotaIsQuotaKind(t *testing.T) {
	testenv.Require(t)
	ns := namespace(t)
	require.NoError(t, env.Client.Create(context.Background(), &corev1.ResourceQuota{
		ObjectMeta: metav1.ObjectMeta{Name: "no-pods", Namespace: ns},
		Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}},
	}))
	// The quota controller does not run on envtest: write its status.
	q := &corev1.ResourceQuota{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "no-pods"}, q))
	q.Status.Hard = q.Spec.Hard
	q.Status.Used = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}
	require.NoError(t, env.Client.Status().Update(context.Background(), q))

	p := newProvider(t, ns)
	o := providers.Owner{UID: uuid.NewUUID(), Namespace: "crawl", Name: "q", Generation: 1}
	_, err := p.Create(context.Background(), request(providers.InstanceName("q", o.UID, 1), o))
	require.Error(t, err)
	assert.True(t, providers.IsQuota(err), "want quota kind, got %v", err)
}

func TestConfigBlockIsStrict(t *testing.T) {
	_, err := kubernetes.New(context.Background(), providers.Entry{Name: "k", Type: kubernetes.Type, Block: []byte(`{"namespace":"x","imgae":"typo"}`)}, providers.Deps{})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `unknown field "imgae"`)
}

// The pod runs squidconf's whole config from a Secret it owns (gone with
// the pod): the egress policy ahead of any allow and, with credentials,
// them and the helper admitting them; Squid runs as its own user, never
// root. A retried create after a crash between the pod and the Secret
// makes the Secret.
func TestThePodRunsTheGeneratedConfigUnprivileged(t *testing.T) {
	testenv.Require(t)
	ns := namespace(t)
	egress, err := netpolicy.ParseEgress("10.0.0.0/8", "127.0.0.2/32", "80,443", "443")
	require.NoError(t, err)
	p, err := kubernetes.New(context.Background(), providers.Entry{Name: "test", Type: kubernetes.Type, Block: []byte(fmt.Sprintf(`{"namespace":%q}`, ns))},
		providers.Deps{Client: env.Client, APIReader: env.Client, Egress: egress})
	require.NoError(t, err)
	o := providers.Owner{UID: uuid.NewUUID(), Namespace: "crawl", Name: "auth", Generation: 1}
	req := request("px-auth-1", o)
	req.Credentials = proxyauth.Credentials{Username: "ep-user", Password: "pw"}
	_, err = p.Create(context.Background(), req)
	require.NoError(t, err)

	pod := &corev1.Pod{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: req.Name}, pod))
	require.Len(t, pod.Spec.Volumes, 1)
	assert.Equal(t, "px-auth-1-squid", pod.Spec.Volumes[0].Secret.SecretName, "the pod mounts its config Secret")
	c := pod.Spec.Containers[0]
	assert.Equal(t, []string{"/usr/sbin/squid", "-NYC", "-d", "1", "-f", "/etc/squid/egress/squid.conf"}, c.Command, "the whole config is ours, not the image's")
	assert.True(t, *pod.Spec.SecurityContext.RunAsNonRoot)
	assert.Equal(t, int64(13), *pod.Spec.SecurityContext.RunAsUser, "Squid's own user")
	assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, pod.Spec.SecurityContext.SeccompProfile.Type)
	assert.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
	assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
	assert.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)

	s := &corev1.Secret{}
	require.NoError(t, get(t, ns, "px-auth-1-squid", s))
	assert.Equal(t, "ep-user", string(s.Data["username"]))
	assert.Equal(t, "pw", string(s.Data["password"]))
	assert.Equal(t, req.Credentials.SquidHelper(), string(s.Data["auth.sh"]), "proxyauth's helper, the one the tests' Squids run")
	assert.Equal(t, squidconf.Config{Listen: "3128", AuthHelper: "/etc/squid/egress/auth.sh", Egress: egress, ShutdownLifetime: 5 * time.Second}.String(),
		string(s.Data["squid.conf"]), "squidconf's config, the one TestAProxyIsNotAWayIn runs")
	assert.Contains(t, string(s.Data["squid.conf"]), "http_access deny egress_denied\n")
	require.Len(t, s.OwnerReferences, 1)
	assert.Equal(t, pod.UID, s.OwnerReferences[0].UID, "the pod owns it: garbage-collected with it")

	// The Secret lost (a create that died after the pod): the retry makes it.
	require.NoError(t, env.Client.Delete(context.Background(), s))
	_, err = p.Create(context.Background(), req)
	require.NoError(t, err)
	require.NoError(t, get(t, ns, "px-auth-1-squid", &corev1.Secret{}))

	// Without credentials: an open proxy, still held to the egress policy.
	open := request("px-open-1", o)
	_, err = p.Create(context.Background(), open)
	require.NoError(t, err)
	require.NoError(t, get(t, ns, "px-open-1-squid", s))
	assert.NotContains(t, s.Data, "password")
	assert.Contains(t, string(s.Data["squid.conf"]), "http_access deny egress_denied\nhttp_access deny !egress_ports\nhttp_access allow all\n")
}

func get(t *testing.T, ns, name string, obj client.Object) error {
	t.Helper()
	return env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj)
}
