package v1alpha1_test

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// rejected creates obj and requires the API server to refuse it as
// Invalid, with every one of want in the message.
func rejected(t *testing.T, obj client.Object, want ...string) {
	t.Helper()
	err := env.Client.Create(context.Background(), obj)
	require.Error(t, err)
	require.True(t, apierrors.IsInvalid(err), "want 422 Invalid, got %v", err)
	for _, w := range want {
		assert.Contains(t, err.Error(), w)
	}
}

func managed(ns, name string) *v1.Proxy {
	return &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ProxySpec{
			Mode:       v1.ModeManaged,
			Provider:   "kubernetes",
			Placement:  &v1.Placement{Zone: "europe-west1-b", MachineType: "e2-micro", Image: "debian-12"},
			CloudInit:  &v1.CloudInit{Inline: "#cloud-config\n"},
			Attributes: map[string]string{"geo": "eu"},
		},
	}
}

func external(ns, name string) *v1.Proxy {
	return &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec:       v1.ProxySpec{Mode: v1.ModeExternal, Address: "203.0.113.7", Port: 8080},
	}
}

func TestValidProxiesAreAcceptedWithDefaults(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ns := env.Namespace(t, "valid")

	m := managed(ns, "valid-managed")
	m.Spec.Mode = "" // defaulted
	require.NoError(t, env.Client.Create(ctx, m))
	assert.Equal(t, v1.ModeManaged, m.Spec.Mode, "mode defaults to Managed")
	assert.Equal(t, int32(3128), m.Spec.Port, "port defaults to 3128")

	e := external(ns, "valid-external")
	require.NoError(t, env.Client.Create(ctx, e))
	assert.Equal(t, int32(8080), e.Spec.Port)

	s := managed(ns, "valid-secret-cloudinit")
	s.Spec.CloudInit = &v1.CloudInit{SecretRef: &v1.SecretKeyRef{Name: "boot"}}
	require.NoError(t, env.Client.Create(ctx, s))
	assert.Equal(t, "user-data", s.Spec.CloudInit.SecretRef.Key, "secret key defaults to user-data")
}

func TestInvalidProxiesAreRejectedNamingTheField(t *testing.T) {
	testenv.Require(t)
	tooMany := map[string]string{}
	for i := range 33 {
		tooMany[strings.Repeat("k", 1)+string(rune('a'+i%26))+strings.Repeat("x", i/26)] = "v"
	}
	cases := []struct {
		name   string
		mutate func(p *v1.Proxy)
		base   func(ns, name string) *v1.Proxy
		want   []string // every fragment must appear in the error
	}{
		{"managed without provider", func(p *v1.Proxy) { p.Spec.Provider = "" }, managed, []string{"spec.provider", "required when spec.mode is Managed"}},
		{"managed with address", func(p *v1.Proxy) { p.Spec.Address = "1.2.3.4" }, managed, []string{"spec.address", "only allowed when spec.mode is External"}},
		{"external without address", func(p *v1.Proxy) { p.Spec.Address = "" }, external, []string{"spec.address", "required when spec.mode is External"}},
		{"external with placement", func(p *v1.Proxy) { p.Spec.Placement = &v1.Placement{Zone: "z"} }, external, []string{"spec.placement", "not allowed when spec.mode is External"}},
		{"external with cloudInit", func(p *v1.Proxy) { p.Spec.CloudInit = &v1.CloudInit{Inline: "x"} }, external, []string{"spec.cloudInit", "not allowed"}},
		{"external with provider", func(p *v1.Proxy) { p.Spec.Provider = "gcp" }, external, []string{"spec.provider", "not allowed"}},
		{"managed with credentialsSecretRef", func(p *v1.Proxy) { p.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: "creds"} }, managed, []string{"spec.credentialsSecretRef", "only allowed when spec.mode is External"}},
		{"credentialsSecretRef not a name", func(p *v1.Proxy) { p.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: "Bad_Name"} }, external, []string{"spec.credentialsSecretRef.name"}},
		{"port -1", func(p *v1.Proxy) { p.Spec.Port = -1 }, managed, []string{"spec.port", "greater than or equal to 1"}},
		{"port 70000", func(p *v1.Proxy) { p.Spec.Port = 70000 }, managed, []string{"spec.port", "65535"}},
		{"unknown mode", func(p *v1.Proxy) { p.Spec.Mode = "Borrowed" }, managed, []string{"spec.mode", "Managed", "External"}},
		{"oversize attribute value", func(p *v1.Proxy) { p.Spec.Attributes = map[string]string{"geo": strings.Repeat("e", 64)} }, managed, []string{"spec.attributes", "1-63 characters"}},
		{"empty attribute value", func(p *v1.Proxy) { p.Spec.Attributes = map[string]string{"geo": ""} }, managed, []string{"spec.attributes", "values"}},
		{"bad attribute key", func(p *v1.Proxy) { p.Spec.Attributes = map[string]string{"no spaces": "x"} }, managed, []string{"spec.attributes", "keys"}},
		{"too many attributes", func(p *v1.Proxy) { p.Spec.Attributes = tooMany }, managed, []string{"spec.attributes", "32"}},
		{"cloudInit with both sources", func(p *v1.Proxy) {
			p.Spec.CloudInit = &v1.CloudInit{Inline: "x", SecretRef: &v1.SecretKeyRef{Name: "s"}}
		}, managed, []string{"spec.cloudInit", "exactly one of inline or secretRef"}},
		{"cloudInit with neither", func(p *v1.Proxy) { p.Spec.CloudInit = &v1.CloudInit{} }, managed, []string{"spec.cloudInit", "exactly one"}},
		{"provider not a DNS label", func(p *v1.Proxy) { p.Spec.Provider = "GCP_EU" }, managed, []string{"spec.provider"}},
		{"health check url not http", func(p *v1.Proxy) { p.Spec.HealthCheck = &v1.HealthCheck{URL: "ftp://example.com/"} }, managed, []string{"spec.healthCheck.url"}},
		{"health check timeout not below interval", func(p *v1.Proxy) {
			p.Spec.HealthCheck = &v1.HealthCheck{IntervalSeconds: 1, TimeoutSeconds: 300}
		}, managed, []string{"spec.healthCheck.timeoutSeconds must be less than spec.healthCheck.intervalSeconds"}},
		{"health check threshold 0", func(p *v1.Proxy) { p.Spec.HealthCheck = &v1.HealthCheck{FailureThreshold: -1} }, managed, []string{"spec.healthCheck.failureThreshold"}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.base("default", "invalid-"+string(rune('a'+i)))
			tc.mutate(p)
			rejected(t, p, tc.want...)
		})
	}
}

// An explicit port 0 cannot be written through the typed client (omitempty
// drops it and the default applies), so it goes in as raw JSON.
func TestExplicitPortZeroIsRejected(t *testing.T) {
	testenv.Require(t)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "crawl.example.com/v1alpha1", "kind": "Proxy",
		"metadata": map[string]any{"name": "port-zero", "namespace": "default"},
		"spec":     map[string]any{"mode": "External", "address": "198.51.100.1", "port": int64(0)},
	}}
	err := env.Client.Create(context.Background(), u)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.port")
	assert.Contains(t, err.Error(), "greater than or equal to 1")
}

func TestImmutableFields(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	p := managed(env.Namespace(t, "immutable"), "immutable")
	require.NoError(t, env.Client.Create(ctx, p))

	changed := p.DeepCopy()
	changed.Spec.Provider = "gcp-eu"
	err := env.Client.Update(ctx, changed)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.provider is immutable")

	// Mutable: attributes and placement (placement changes replace the
	// instance, which is the controller's business, not the schema's).
	ok := p.DeepCopy()
	ok.Spec.Attributes["tier"] = "gold"
	ok.Spec.Placement.Zone = "us-central1-a"
	require.NoError(t, env.Client.Update(ctx, ok))
}

func TestCRDHasPrinterColumnsAndShortName(t *testing.T) {
	testenv.Require(t)
	crd := &apiextensionsv1.CustomResourceDefinition{}
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Name: "proxies.crawl.example.com"}, crd))
	assert.Contains(t, crd.Spec.Names.ShortNames, "px")
	require.Len(t, crd.Spec.Versions, 1)
	v := crd.Spec.Versions[0]
	require.NotNil(t, v.Subresources)
	assert.NotNil(t, v.Subresources.Status, "status subresource")
	var shown []string
	for _, c := range v.AdditionalPrinterColumns {
		if c.Priority == 0 {
			shown = append(shown, strings.ToUpper(c.Name))
		}
	}
	// NAME is implicit; the rest in the order docs/api/proxy.md shows.
	assert.Equal(t, []string{"MODE", "PROVIDER", "PHASE", "IP", "HEALTHY", "AGE"}, shown)
}
