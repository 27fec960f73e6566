package demo

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// A bought proxy that asks for credentials: the probers authenticate with
// the ones its Proxy names, so it turns Healthy; the lease hands them to
// the crawler, which egresses through the proxy with them, and without
// them gets 407.
func TestAnExternalProxyWithCredentials(t *testing.T) {
	s, ns := up(t, system.Options{BrokerToken: "crawler-token"})
	squid := proc.StartSquidWithAuth(t, "127.0.0.1", "buyer", "paid-for")
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bought", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data:       map[string][]byte{"username": []byte("buyer"), "password": []byte("paid-for")},
	}))
	require.NoError(t, env.Client.Create(ctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "bought"},
		Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: squid.Host, Port: int32(squid.Port), CredentialsSecretRef: &v1.LocalSecretRef{Name: "bought"}}}))
	waitProxy(t, ns, "bought", "Healthy through its credentials", healthy)

	var lease rest.Reply
	require.Eventually(t, func() bool {
		lease = rest.Do(t, "POST", s.Brokers[0].REST+"/v1/leases", `{"namespace":"`+ns+`"}`, "Authorization", "Bearer crawler-token")
		return lease.Status == 200
	}, 30*time.Second, 50*time.Millisecond)
	creds := lease.JSON["credentials"].(map[string]any)
	assert.Equal(t, "buyer", creds["username"])
	proxyURL := mustURL("http://" + squid.Addr)
	get := func(u *url.URL) (int, string) {
		tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: tlsTo(s)}
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(s.Target.URL + "/ip")
		if err != nil {
			return 0, err.Error()
		}
		defer func() { _ = resp.Body.Close() }()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(body))
	}
	proxyURL.User = url.UserPassword(creds["username"].(string), creds["password"].(string))
	code, body := get(proxyURL)
	assert.Equal(t, 200, code, body)
	assert.Equal(t, "127.0.0.1", body, "egressed through the bought proxy with the lease's credentials")
	_, body = get(mustURL("http://" + squid.Addr))
	assert.Contains(t, body, "Proxy Authentication Required", "without them the proxy refuses")

	// Wrong credentials in the Secret: the probers' CONNECT is refused,
	// and the Proxy says why.
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bought"}, &sec))
	sec.Data["password"] = []byte("expired")
	require.NoError(t, env.Client.Update(ctx, &sec))
	px := waitProxy(t, ns, "bought", "unhealthy with the wrong password", func(px *v1.Proxy) bool { return !px.Status.Healthy })
	assert.Contains(t, healthCondition(px).Message, "407")
}

// A Managed proxy is no open proxy: its Squid asks for credentials of its
// own (derived from the controller's key), the probers send them so it
// turns Healthy, and the lease hands them to the crawler.
func TestAManagedProxyAsksForItsOwnCredentials(t *testing.T) {
	s, ns := up(t, system.Options{BrokerToken: "crawler-token", ProxyCredentials: true})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, managed(ns, "locked")))
	px := waitProxy(t, ns, "locked", "Ready and Healthy through its credentials", healthy)

	var lease rest.Reply
	require.Eventually(t, func() bool {
		lease = rest.Do(t, "POST", s.Brokers[1].REST+"/v1/leases", `{"namespace":"`+ns+`"}`, "Authorization", "Bearer crawler-token")
		return lease.Status == 200
	}, 30*time.Second, 50*time.Millisecond)
	creds, ok := lease.JSON["credentials"].(map[string]any)
	require.True(t, ok, "the lease carries credentials: %s", lease.Body)
	assert.Regexp(t, `^ep-[0-9a-f]{16}$`, creds["username"])

	fetch := func(u *url.URL) string {
		tr := &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: tlsTo(s)}
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(s.Target.URL + "/ip")
		if err != nil {
			return err.Error()
		}
		_ = resp.Body.Close()
		return resp.Status
	}
	open := mustURL(fmt.Sprintf("http://%s:%d", px.Status.IP, px.Status.Port))
	assert.Contains(t, fetch(open), "Proxy Authentication Required", "without credentials the CONNECT is refused")
	withCreds := *open
	withCreds.User = url.UserPassword(creds["username"].(string), creds["password"].(string))
	assert.Equal(t, "200 OK", fetch(&withCreds), "with the lease's credentials it egresses")

	// Another proxy's credentials are not these.
	require.NoError(t, env.Client.Create(ctx, managed(ns, "other")))
	other := waitProxy(t, ns, "other", "Ready and Healthy", healthy)
	otherURL := mustURL(fmt.Sprintf("http://%s:%d", other.Status.IP, other.Status.Port))
	otherURL.User = withCreds.User
	assert.Contains(t, fetch(otherURL), "Proxy Authentication Required", "each Managed proxy has credentials of its own")
}
