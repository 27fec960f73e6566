package broker

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// A lease of a proxy that asks for credentials carries them, but only from
// a broker that wants a bearer token: an open API never hands them out.
func TestLeaseCarriesTheProxysCredentials(t *testing.T) {
	f := newFleet(t)
	px := env.ReadyProxy(t, f.ns, "bought", "127.0.0.95", 3128, nil, true)
	require.NoError(t, env.Client.Create(t.Context(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "bought-creds", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte("s3cret")},
	}))
	patch := client.MergeFrom(px.DeepCopy())
	px.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: "bought-creds"}
	require.NoError(t, env.Client.Patch(t.Context(), px, patch))

	tokenFile := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("crawler-token"), 0o600))
	r := proc.StartRedis(t, false)
	authed := startBroker(t, f, r, "--token-file", tokenFile)
	open := startBroker(t, f, r)
	open.WaitListed(1)

	l := authed.Do("POST", "/v1/leases", `{"ttlSeconds":60}`, "Authorization", "Bearer crawler-token")
	require.Equal(t, 200, l.Status, string(l.Body))
	assert.Equal(t, map[string]any{"username": "crawler", "password": "s3cret"}, l.JSON["credentials"])

	l = open.Lease(`{"ttlSeconds":60}`)
	require.Equal(t, 200, l.Status, string(l.Body))
	assert.Nil(t, l.JSON["credentials"], "an unauthenticated API hands out no credentials")
}
