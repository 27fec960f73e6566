package kube_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestProxyCredentialsOf(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "creds")
	require.NoError(t, env.Client.Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bought"},
		Data:       map[string][]byte{proxyauth.KeyUsername: []byte("u"), proxyauth.KeyPassword: []byte("p")},
	}))
	require.NoError(t, env.Client.Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "half"},
		Data:       map[string][]byte{proxyauth.KeyUsername: []byte("u")},
	}))
	key := proxyauth.Key("0123456789abcdef0123456789abcdef")
	src := kube.ProxyCredentials{Key: key, Secrets: env.Client}

	external := func(secret string) *v1.Proxy {
		px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "x", UID: "uid-x"}, Spec: v1.ProxySpec{Mode: v1.ModeExternal}}
		if secret != "" {
			px.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: secret}
		}
		return px
	}
	managed := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "m", UID: "uid-m"}, Spec: v1.ProxySpec{Mode: v1.ModeManaged}}

	for _, tc := range []struct {
		name    string
		src     kube.ProxyCredentials
		px      *v1.Proxy
		want    proxyauth.Credentials
		wantErr []string
	}{
		{"managed: derived from the key and the UID", src, managed, key.Derive("uid-m"), nil},
		{"managed without a key: none", kube.ProxyCredentials{Secrets: env.Client}, managed, proxyauth.Credentials{}, nil},
		{"external naming no Secret: none", src, external(""), proxyauth.Credentials{}, nil},
		{"external: the Secret's", src, external("bought"), proxyauth.Credentials{Username: "u", Password: "p"}, nil},
		{"missing Secret", src, external("gone"), proxyauth.Credentials{}, []string{ns + "/gone", v1.LabelProxyCredentials}},
		{"Secret without a password", src, external("half"), proxyauth.Credentials{}, []string{ns + "/half", `"password"`}},
		{"no Secret reader", kube.ProxyCredentials{Key: key}, external("bought"), proxyauth.Credentials{}, []string{"no credentials Secret is read here", "--credentials-secrets=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.src.Of(t.Context(), kube.CredentialsRefOf(tc.px))
			for _, w := range tc.wantErr {
				require.Error(t, err)
				assert.Contains(t, err.Error(), w)
			}
			if tc.wantErr == nil {
				require.NoError(t, err)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}
