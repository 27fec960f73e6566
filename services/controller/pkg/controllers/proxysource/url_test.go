package proxysource_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// listServer serves what answer says, counting requests.
type listServer struct {
	*httptest.Server
	mu     sync.Mutex
	answer func(w http.ResponseWriter, r *http.Request)
	hits   atomic.Int32
}

func newListServer(t *testing.T) *listServer {
	ls := &listServer{}
	ls.Server = proc.Serve(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ls.hits.Add(1)
		ls.mu.Lock()
		a := ls.answer
		ls.mu.Unlock()
		a(w, r)
	}), false)
	return ls
}

func (ls *listServer) serve(a func(w http.ResponseWriter, r *http.Request)) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.answer = a
}

func lines(n int, from int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "10.3.%d.%d:3128\n", (from+i)/250, (from+i)%250+1)
	}
	return b.String()
}

// A URL source, with a bearer token from a Secret, through every way a
// fetch goes wrong: each changes nothing and says why; half a list
// malformed applies the good half; a 90 % shrink waits for confirmation.
func TestAURLSourceSurvivesWhatURLsDo(t *testing.T) {
	allow, err := netpolicy.ParseEgress(netpolicy.DefaultEgressDenyCIDRs, proc.SuiteAllowance, "80,443", "443")
	require.NoError(t, err)
	h := start(t, allow)
	ls := newListServer(t)
	ls.serve(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer list-token" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		_, _ = fmt.Fprint(w, lines(10, 0))
	})
	h.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "list-auth", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data: map[string][]byte{"token": []byte("list-token")}})
	h.source("url", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: ls.URL + "/list", AuthSecretRef: &v1.LocalSecretRef{Name: "list-auth"},
		RefreshInterval: &metav1.Duration{Duration: 10 * time.Second}, Timeout: &metav1.Duration{Duration: time.Second}, MaxBytes: ptr.To[int64](1 << 20)}})
	h.waitFor("url", "ready with 10", ready(10))
	before := identities(h.members("url"))

	failures := []struct {
		name   string
		answer func(w http.ResponseWriter, r *http.Request)
		want   string
	}{
		{"500", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", 500) }, "it answered 500 Internal Server Error"},
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(5 * time.Second):
			}
		}, "Client.Timeout exceeded"},
		{"50 MiB", func(w http.ResponseWriter, _ *http.Request) {
			chunk := []byte(strings.Repeat("10.9.9.9:3128\n", 1<<10))
			for range (50 << 20) / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}, "its body is over spec.url.maxBytes (1048576)"},
		{"garbage", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = fmt.Fprint(w, "<html>sorry</html>\n<p>maintenance</p>\n")
		}, "none of the 2 entries is valid"},
	}
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			ls.serve(f.answer)
			h.refresh("url")
			s := h.waitFor("url", f.name, func(s *v1.ProxySource) bool {
				c := cond(s, v1.ConditionSynced)
				return c.Status == metav1.ConditionFalse && strings.Contains(c.Message, f.want)
			})
			assert.Contains(t, cond(s, v1.ConditionSynced).Message, "no member was changed")
			assert.Equal(t, before, identities(h.members("url")), "a failed read changes no member")
			assert.Equal(t, int32(10), s.Status.Desired)
		})
	}

	// Each failure began with a Warning saying why.
	require.Eventually(t, func() bool {
		var evs eventsv1.EventList
		_ = env.Client.List(context.Background(), &evs, client.InNamespace(h.ns))
		n := map[string]int{}
		for _, e := range evs.Items {
			if e.Regarding.Name == "url" && e.Type == corev1.EventTypeWarning {
				n[e.Reason]++
			}
		}
		return n[v1.ReasonFetchFailed] >= 1 && n[v1.ReasonNoValidEntries] == 1
	}, 10*time.Second, 50*time.Millisecond, "Warnings for the failed reads")

	// Half the lines malformed: the good half applies, the bad are named.
	ls.serve(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprint(w, lines(10, 0)+lines(2, 10)+"bad one\n[::1:3128\nalso:bad:x\n:3128\nhost:\n10.3.0.1\n10.3.1.1:0\nx y:3128\n1.2.3.4:3128:user-only\n10.3.1.2:3128::pass\n10.3.1.3:3128:u:p\n10.3.1.4:3128:u:p\n")
	})
	h.refresh("url")
	s := h.waitFor("url", "ready with 14", ready(14))
	assert.Equal(t, int32(10), s.Status.Rejected, "every bad line counted")
	assert.Len(t, s.Status.RejectedEntries, 10)
	assert.Contains(t, s.Status.RejectedEntries[0], `line 13: "bad one" is not host:port[:user:pass]`)

	// 90 % gone at once: held, new entries still added.
	ls.serve(func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, lines(1, 0)+lines(1, 100)) })
	h.refresh("url")
	s = h.waitFor("url", "holding the shrink", synced(v1.ReasonShrinkHeld))
	require.NotNil(t, s.Status.HeldShrink)
	assert.Equal(t, int32(2), s.Status.HeldShrink.To)
	assert.GreaterOrEqual(t, s.Status.HeldShrink.From, int32(14))
	assert.Contains(t, cond(s, v1.ConditionSynced).Message, v1.AnnotationConfirmShrink+"=2")
	require.Eventually(t, func() bool { return len(h.members("url")) == 15 }, 10*time.Second, 50*time.Millisecond, "the new entry is added, nothing drains")
	for _, px := range h.members("url") {
		_, draining := px.DrainDeadline()
		assert.False(t, draining, "%s drains while the shrink is held", px.Name)
	}
	// Confirmed: 13 drain (none is leased) and go.
	require.Eventually(t, func() bool {
		src := h.get("url")
		src.Annotations[v1.AnnotationConfirmShrink] = "2"
		return env.Client.Update(context.Background(), src) == nil
	}, 10*time.Second, 50*time.Millisecond)
	s = h.waitFor("url", "ready with 2", ready(2))
	assert.Nil(t, s.Status.HeldShrink)
	assert.Len(t, h.members("url"), 2)
}

// The egress policy holds a URL source's fetch as it holds probes: a
// list on loopback is refused without the suites' allowance.
func TestAURLSourceIsHeldToTheEgressPolicy(t *testing.T) {
	h := start(t, netpolicy.DefaultEgress())
	ls := newListServer(t)
	ls.serve(func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprint(w, lines(3, 0)) })
	h.source("denied", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: ls.URL + "/list"}})
	s := h.waitFor("denied", "refused", synced(v1.ReasonFetchFailed))
	assert.Contains(t, cond(s, v1.ConditionSynced).Message, "127.0.0.1 is in the deny list (127.0.0.0/8)")
	assert.Zero(t, ls.hits.Load(), "no byte reached the list server")
	assert.Empty(t, h.members("denied"))
}

// A vendor endpoint becomes sessions × countries members, each with its
// own user name in the vendor's grammar and the account's password, and
// its country attribute.
func TestAVendorEndpointExpandsIntoSessions(t *testing.T) {
	h := start(t, netpolicy.Egress{})
	h.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "brd", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data: map[string][]byte{"password": []byte("zone-pass")}})
	h.source("brd", v1.ProxySourceSpec{Vendor: &v1.SourceVendor{Preset: v1.PresetBrightData, Host: "10.4.0.1", Port: 22225,
		Account: "c77", Zone: "resi", PasswordSecretRef: v1.LocalSecretRef{Name: "brd"}, Sessions: 3, Countries: []string{"us", "de"}}})
	h.waitFor("brd", "ready with 6", ready(6))
	ms := h.members("brd")
	assert.Equal(t, []string{
		"10.4.0.1:22225 brd-customer-c77-zone-resi-country-de-session-brdde0",
		"10.4.0.1:22225 brd-customer-c77-zone-resi-country-de-session-brdde1",
		"10.4.0.1:22225 brd-customer-c77-zone-resi-country-de-session-brdde2",
		"10.4.0.1:22225 brd-customer-c77-zone-resi-country-us-session-brdus0",
		"10.4.0.1:22225 brd-customer-c77-zone-resi-country-us-session-brdus1",
		"10.4.0.1:22225 brd-customer-c77-zone-resi-country-us-session-brdus2",
	}, identities(ms))
	px := ms["10.4.0.1:22225 brd-customer-c77-zone-resi-country-de-session-brdde1"]
	assert.Equal(t, map[string]string{"country": "de"}, px.Spec.Attributes)
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: px.Spec.CredentialsSecretRef.Name}, &sec))
	assert.Equal(t, "brd-customer-c77-zone-resi-country-de-session-brdde1", string(sec.Data["username"]))
	assert.Equal(t, "zone-pass", string(sec.Data["password"]))

	// The password rotates: every member's credentials follow.
	var pass corev1.Secret
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: "brd"}, &pass))
	pass.Data["password"] = []byte("rotated")
	require.NoError(t, env.Client.Update(context.Background(), &pass))
	require.Eventually(t, func() bool {
		_ = env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: px.Spec.CredentialsSecretRef.Name}, &sec)
		return string(sec.Data["password"]) == "rotated"
	}, 10*time.Second, 50*time.Millisecond)
}

// An HTTPS list verified with a CA from a Secret, behind basic auth from
// another: read; without the CA, the system's roots refuse the server
// and nothing changes.
func TestAURLSourceOverTLSWithBasicAuth(t *testing.T) {
	allow, err := netpolicy.ParseEgress(netpolicy.DefaultEgressDenyCIDRs, proc.SuiteAllowance, "80,443", "443")
	require.NoError(t, err)
	h := start(t, allow)
	srv := proc.Serve(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "lists" || p != "open-sesame" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		_, _ = fmt.Fprint(w, lines(2, 0))
	}), true)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	h.create(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "list-ca", Labels: map[string]string{v1.LabelProxyCredentials: "true"}}, Data: map[string][]byte{"ca.crt": ca}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "list-login", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
			Data: map[string][]byte{"username": []byte("lists"), "password": []byte("open-sesame")}},
	)
	h.source("tls", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: srv.URL + "/list", CASecretRef: &v1.KeyRef{Name: "list-ca"}, AuthSecretRef: &v1.LocalSecretRef{Name: "list-login"}}})
	h.waitFor("tls", "ready with 2", ready(2))

	h.source("untrusted", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: srv.URL + "/list", AuthSecretRef: &v1.LocalSecretRef{Name: "list-login"}}})
	s := h.waitFor("untrusted", "refused", synced(v1.ReasonFetchFailed))
	assert.Contains(t, cond(s, v1.ConditionSynced).Message, "certificate")
	assert.Empty(t, h.members("untrusted"))
}
