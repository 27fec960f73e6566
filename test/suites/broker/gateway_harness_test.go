package broker

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// gwFleet is a gateway's world: Squids asking for credentials, each
// egressing from its own address, as Proxies of a namespace; a broker
// serving the gateway with two named tokens; a plain-HTTP site that
// rate-limits the first proxy's address, and an HTTPS one that echoes
// the caller's.
type gwFleet struct {
	*fleet
	b       *broker
	gw      string
	squids  []*proc.Squid
	site    *httptest.Server
	echo    *httptest.Server
	limited string
	// redis and tokenFile serve a second broker on the same state.
	redis     *proc.Redis
	tokenFile string
}

const (
	gwToken    = "s3cret-gateway-token"
	otherToken = "another-teams-token"
)

func newGatewayFleet(t *testing.T, extra ...string) *gwFleet {
	f := &gwFleet{fleet: newFleet(t)}
	for i, ip := range []string{"127.0.8.1", "127.0.8.2"} {
		f.squids = append(f.squids, squidProxy(t, f.ns, fmt.Sprintf("p%d", i), ip, map[string]string{"pool": "gw"}))
	}
	f.limited = f.squids[0].Host
	f.site = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		switch {
		case r.URL.Path == "/big":
			_, _ = w.Write(bytes.Repeat([]byte("x"), 300<<10))
		case r.URL.Path == "/blocked":
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, "<html>please solve this CAPTCHA</html>")
		case ip == f.limited:
			w.Header().Set("Retry-After", "60")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			_, _ = io.WriteString(w, "page for "+ip)
		}
	}))
	t.Cleanup(f.site.Close)
	f.echo = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ip, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, ip)
	}))
	t.Cleanup(f.echo.Close)

	tokenFile := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokenFile, []byte("crawlers:"+gwToken+"\nothers:"+otherToken+"\n"), 0o600))
	port := proc.FreePort(t)
	f.gw = proc.Addr(port)
	args := append([]string{"--token-file", tokenFile, "--gateway-addr", f.gw, "--egress-allowance-cidrs", proc.SuiteAllowance}, extra...)
	f.redis, f.tokenFile = proc.StartRedis(t, false), tokenFile
	f.b = startBroker(t, f.fleet, f.redis, args...)
	if !slices.Contains(extra, "--tls-cert-file") { // else REST is TLS: the test waits its way
		f.waitLeasable()
	}
	return f
}

// squidProxy starts a Squid on ip asking for credentials and makes it a
// Ready, healthy Proxy of ns whose Secret holds them.
func squidProxy(t testing.TB, ns, name, ip string, attrs map[string]string) *proc.Squid {
	t.Helper()
	sq := proc.StartSquidWithAuth(t, ip, "squid-user", "pass-of-"+name)
	proxyOf(t, ns, name, sq, "pass-of-"+name, attrs)
	return sq
}

// proxyOf makes sq, whose password for squid-user is password, the
// Ready, healthy Proxy name of ns, with a Secret holding the credentials.
func proxyOf(t testing.TB, ns, name string, sq *proc.Squid, password string, attrs map[string]string) {
	t.Helper()
	px := env.ReadyProxy(t, ns, name, sq.Host, int32(sq.Port), attrs, true)
	require.NoError(t, env.Client.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-creds", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data:       map[string][]byte{"username": []byte("squid-user"), "password": []byte(password)},
	}))
	patch := client.MergeFrom(px.DeepCopy())
	px.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: name + "-creds"}
	require.NoError(t, env.Client.Patch(context.Background(), px, patch))
}

// waitLeasable waits until the broker lists both proxies.
func (f *gwFleet) waitLeasable() {
	require.Eventually(f.t, func() bool {
		r := f.b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer "+gwToken)
		ps, _ := r.JSON["proxies"].([]any)
		return len(ps) == 2
	}, 30*time.Second, 50*time.Millisecond)
}

// client is an HTTP client whose proxy is the gateway, with user as the
// proxy user name, one connection per request unless keepAlive.
func (f *gwFleet) client(user, pass string, keepAlive bool) *http.Client {
	pool := f.echo.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:             http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(user, pass), Host: f.gw}),
		TLSClientConfig:   &tls.Config{RootCAs: pool},
		DisableKeepAlives: !keepAlive,
	}}
}

func get(t *testing.T, c *http.Client, u string) (int, string, http.Header) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b), resp.Header
}

// liveLeases sums the proxies' lease counts.
func (f *gwFleet) liveLeases() int {
	r := f.b.Do("GET", "/v1/proxies", "", "Authorization", "Bearer "+gwToken)
	require.Equal(f.t, 200, r.Status, string(r.Body))
	n := 0
	for _, p := range r.JSON["proxies"].([]any) {
		n += int(p.(map[string]any)["leaseCount"].(float64))
	}
	return n
}

// waitNoLeases waits until every lease the gateway took is released.
func (f *gwFleet) waitNoLeases() {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return f.liveLeases() == 0 }, 10*time.Second, 20*time.Millisecond, "the gateway left leases behind")
}

// raw sends one request's head to the gateway and reads the answer.
func (f *gwFleet) raw(t *testing.T, head string) *http.Response {
	t.Helper()
	return rawTo(t, f.gw, head)
}

func rawTo(t *testing.T, gw, head string) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", gw)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = io.WriteString(c, head)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// tunnel opens a CONNECT tunnel to the address to through the gateway at
// gw with the Proxy-Authorization line auth, and returns it open (closed
// when the test ends) with the gateway's 200.
func tunnel(t *testing.T, gw, auth, to string) (net.Conn, *http.Response) {
	t.Helper()
	c, err := net.Dial("tcp", gw)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\n%s\r\n\r\n", to, auth)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	return c, resp
}

func basic(user, pass string) string {
	r := http.Request{Header: http.Header{}}
	r.SetBasicAuth(user, pass)
	return strings.Replace(r.Header.Get("Authorization"), "Basic", "Proxy-Authorization: Basic", 1)
}
