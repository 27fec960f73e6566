package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/vendorproxy"
	"github.com/egress-proxies/egress-proxies/pkg/vendors"
)

// A vendor's back-connect endpoint (the stand-in: a real proxy that
// reads Decodo's user names and egresses each session from its own
// loopback address) brought in by a ProxySource of 50 sessions over two
// countries: 100 proxies, probed through the endpoint with their own
// session names, healthy, with 100 distinct exits. A crawl through the
// gateway written as for Decodo itself (only the host, port and password
// switched) lands on the country asked for, and a site that rate-limits
// some exits cools down those exits and no other. When the vendor moves
// a session to another exit, the member's exit follows and the source
// counts the move.
func TestAVendorSourceBecomesAFleetTheGatewayCrawlsThrough(t *testing.T) {
	const token = "crawler-token"
	s, ns := up(t, system.Options{BrokerToken: token, Gateway: true, HealthInterval: 2 * time.Second})
	vendor := vendorproxy.Start(t, v1.PresetDecodo, "vendor-pass")
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "decodo", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data:       map[string][]byte{"password": []byte("vendor-pass")},
	}))
	require.NoError(t, env.Client.Create(ctx, &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "decodo"},
		Spec: v1.ProxySourceSpec{Vendor: &v1.SourceVendor{Preset: v1.PresetDecodo, Host: vendor.Host, Port: int32(vendor.Port), Account: "acct",
			PasswordSecretRef: v1.LocalSecretRef{Name: "decodo"}, Sessions: 50, Countries: []string{"us", "de"}, SessionPrefix: "e2e"},
			Attributes: map[string]string{"tier": "residential"}}}))

	var src v1.ProxySource
	require.Eventually(t, func() bool {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "decodo"}, &src)
		return src.Status.Healthy == 100 && src.Status.Present == 100
	}, 3*time.Minute, 200*time.Millisecond, "the source never had 100 healthy members: %+v", src.Status)
	members := sourceMembers(t, ns, "decodo")
	exits := map[string]string{}
	for _, px := range members {
		user := strings.Fields(px.Annotations[v1.AnnotationSourceEntry])[1]
		sess, err := vendors.Parse(v1.PresetDecodo, user)
		require.NoError(t, err)
		want, ok := vendor.Exit(sess.Country, sess.ID)
		require.True(t, ok, "the vendor saw session %s", sess.ID)
		assert.Equal(t, want.String(), px.Status.EgressIP, "%s's exit is its session's", px.Name)
		assert.Equal(t, sess.Country, px.Spec.Attributes["country"])
		exits[px.Status.EgressIP] = px.Name
	}
	assert.Len(t, exits, 100, "100 sessions, 100 distinct exits")
	assert.Empty(t, vendor.Refused(), "the vendor refused no user name the controller wrote")

	// A site that rate-limits a fixed set of exits, on its own address.
	site := newBanningSite(t, "127.0.50.1")
	var us []string
	for ip, name := range exits {
		if members[name].Spec.Attributes["country"] == "us" {
			us = append(us, ip)
		}
	}
	slices.Sort(us)
	site.ban(us[:20]...)
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Go(func() {
			user := fmt.Sprintf("user-acct-country-us-session-crawl%d", i)
			code, body := crawl(s.Brokers[0].Gateway, user, token, site.URL+"/page")
			if code != http.StatusOK && code != http.StatusTooManyRequests {
				t.Errorf("crawl %d: %d %s", i, code, body)
			}
		})
	}
	wg.Wait()
	seen := site.seen()
	require.NotEmpty(t, seen)
	for ip := range seen {
		assert.Contains(t, us, ip, "the gateway took a country=us crawl through %s, not a us exit", ip)
	}
	// Cooled down for the site: exactly the exits it pushed away.
	var cooled, pushed []string
	for ip := range seen {
		if slices.Contains(us[:20], ip) {
			pushed = append(pushed, ip)
		}
	}
	require.NotEmpty(t, pushed, "the crawl met some of the banned exits")
	r := rest.Do(t, "GET", s.Brokers[0].REST+"/v1/proxies?namespace="+ns+"&target=127.0.50.1&country=us", "", "Authorization", "Bearer "+token)
	require.Equal(t, 200, r.Status, string(r.Body))
	for _, p := range r.JSON["proxies"].([]any) {
		m := p.(map[string]any)
		if m["cooldownUntil"] != nil {
			cooled = append(cooled, m["egressIP"].(string))
		}
	}
	slices.Sort(cooled)
	slices.Sort(pushed)
	assert.Equal(t, pushed, cooled, "the rate-limited exits cool down for the site, and only they")
	t.Logf("40 crawl sessions went out through %d us exits; %d of them were rate-limited and cool down", len(seen), len(cooled))

	// The vendor moves a session: the member's exit follows, counted.
	var de *v1.Proxy
	for _, px := range members {
		if strings.HasSuffix(px.Annotations[v1.AnnotationSourceEntry], "session-e2ede0") {
			de = px
		}
	}
	require.NotNil(t, de)
	moved := vendor.Rotate("de", "e2ede0")
	require.Eventually(t, func() bool {
		var px v1.Proxy
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(de), &px)
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "decodo"}, &src)
		return px.Status.EgressIP == moved.String() && px.Annotations[v1.AnnotationExits] == de.Status.EgressIP+","+moved.String() && src.Status.ExitChanges >= 1
	}, time.Minute, 200*time.Millisecond, "the moved exit was never recorded")
}

func sourceMembers(t *testing.T, ns, source string) map[string]*v1.Proxy {
	var list v1.ProxyList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns), client.MatchingLabels{v1.LabelSource: source}))
	out := map[string]*v1.Proxy{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// crawl GETs u through the gateway as user with the gateway password.
func crawl(gateway, user, pass, u string) (int, string) {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		Proxy: http.ProxyURL(&url.URL{Scheme: "http", User: url.UserPassword(user, pass), Host: gateway})}}
	resp, err := hc.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// banningSite answers 429 to the exits it bans and 200 to the rest, and
// remembers every exit it saw.
type banningSite struct {
	*httptest.Server
	mu     sync.Mutex
	banned map[string]bool
	exits  map[string]bool
}

func newBanningSite(t *testing.T, ip string) *banningSite {
	b := &banningSite{banned: map[string]bool{}, exits: map[string]bool{}}
	ln, err := net.Listen("tcp", ip+":0")
	require.NoError(t, err)
	b.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		b.mu.Lock()
		b.exits[host] = true
		banned := b.banned[host]
		b.mu.Unlock()
		if banned {
			w.Header().Set("Retry-After", "600")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		_, _ = io.WriteString(w, "a page")
	}))
	b.Listener = ln
	b.Start()
	t.Cleanup(b.Close)
	return b
}

func (b *banningSite) ban(ips ...string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, ip := range ips {
		b.banned[ip] = true
	}
}

func (b *banningSite) seen() map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := map[string]bool{}
	for k := range b.exits {
		out[k] = true
	}
	return out
}
