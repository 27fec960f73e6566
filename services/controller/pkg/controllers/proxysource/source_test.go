package proxysource_test

import (
	"context"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxysource"
)

// A ConfigMap list: the good lines become members (one with its own
// credentials Secret), the bad ones are named, an edit that removes an
// entry drains its member until its lease ends, then deletes it with its
// credentials; an entry that comes back before that keeps its member.
func TestAListInAConfigMapIsKeptInSync(t *testing.T) {
	h := start(t, netpolicy.Egress{})
	h.create(listMap("# bought in March\n10.1.0.1:3128\n10.1.0.2:3128:buyer:s3cret\n\n10.1.0.3:8080\n[fd00::4]:3128\nnot-a-line\n10.1.0.5:99999\n10.1.0.1:3128\n"))
	h.source("list", v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "list"}},
		Attributes: map[string]string{"tier": "dc"}, DrainTimeout: &metav1.Duration{Duration: time.Minute}})
	s := h.waitFor("list", "ready with 4 members", ready(4))
	assert.Equal(t, int32(3), s.Status.Rejected)
	assert.Equal(t, []string{
		`line 7: "not-a-line" is not host:port[:user:pass]`,
		`line 8: port "99999" is not a number`,
		"line 9: 10.1.0.1:3128 is listed twice",
	}, s.Status.RejectedEntries)
	assert.Contains(t, cond(s, v1.ConditionSynced).Message, "4 entries applied; 3 rejected")
	ms := h.members("list")
	assert.Equal(t, []string{"10.1.0.1:3128", "10.1.0.2:3128 buyer", "10.1.0.3:8080", "[fd00::4]:3128"}, identities(ms))
	withCreds := ms["10.1.0.2:3128 buyer"]
	assert.Equal(t, v1.ModeExternal, withCreds.Spec.Mode)
	assert.Equal(t, map[string]string{"tier": "dc"}, withCreds.Spec.Attributes)
	require.NotNil(t, withCreds.Spec.CredentialsSecretRef)
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: withCreds.Spec.CredentialsSecretRef.Name}, &sec))
	assert.Equal(t, "s3cret", string(sec.Data["password"]))
	assert.Equal(t, "true", sec.Labels[v1.LabelProxyCredentials])

	// Two entries leave; one holds a lease.
	leased := ms["10.1.0.2:3128 buyer"]
	h.leases.set(leased.Key(), 1)
	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: "list"}, &cm))
	cm.Data["proxies"] = "10.1.0.1:3128\n10.1.0.3:8080\n"
	require.NoError(t, env.Client.Update(context.Background(), &cm))
	h.waitFor("list", "draining one", func(s *v1.ProxySource) bool {
		return s.Status.Draining == 1 && s.Status.Present == 3 && cond(s, v1.ConditionReady).Reason == v1.ReasonMembersDraining
	})
	ms = h.members("list")
	_, draining := ms["10.1.0.2:3128 buyer"].DrainDeadline()
	assert.True(t, draining, "the leased member drains")
	assert.NotContains(t, ms, "[fd00::4]:3128", "the unleased one is gone once its drain settled")

	// The leased entry comes back: its drain is taken back.
	cm.Data["proxies"] = "10.1.0.1:3128\n10.1.0.3:8080\n10.1.0.2:3128:buyer:s3cret\n"
	require.NoError(t, env.Client.Update(context.Background(), &cm))
	h.waitFor("list", "ready with 3", ready(3))
	_, draining = h.members("list")["10.1.0.2:3128 buyer"].DrainDeadline()
	assert.False(t, draining)

	// It leaves again; its lease ends; it goes, and its Secret with it.
	cm.Data["proxies"] = "10.1.0.1:3128\n10.1.0.3:8080\n"
	require.NoError(t, env.Client.Update(context.Background(), &cm))
	h.waitFor("list", "draining", func(s *v1.ProxySource) bool { return s.Status.Draining == 1 })
	time.Sleep(500 * time.Millisecond)
	assert.Contains(t, h.members("list"), "10.1.0.2:3128 buyer", "a member with a live lease stays until its drain deadline")
	h.leases.set(leased.Key(), 0)
	h.waitFor("list", "ready with 2", ready(2))
	require.Eventually(t, func() bool {
		return env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: leased.Name}, &corev1.Secret{}) != nil
	}, 10*time.Second, 50*time.Millisecond, "the member's credentials are deleted with it")
}

// A source deletes and writes only the credential Secrets it made: a
// member whose credentialsSecretRef was pointed at another Secret (by
// anyone who may edit Proxies) leaves that Secret alone when it goes, and
// a Secret of someone else's where a member's credentials belong is
// named in an error, never overwritten.
func TestASourceTouchesOnlySecretsItMade(t *testing.T) {
	h := start(t, netpolicy.Egress{})
	victim := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "victim", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data: map[string][]byte{"username": []byte("other"), "password": []byte("team's")}}
	h.create(victim, listMap("10.5.0.1:3128:u:p\n10.5.0.2:3128\n"))
	h.source("list", v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "list"}}, MaxShrinkPercent: ptr.To[int32](100)})
	h.waitFor("list", "ready with 2", ready(2))
	member := h.members("list")["10.5.0.1:3128 u"]
	own := member.Spec.CredentialsSecretRef.Name

	// Someone who may edit Proxies points the member at the victim.
	require.Eventually(t, func() bool {
		px := h.members("list")["10.5.0.1:3128 u"]
		px.Spec.CredentialsSecretRef.Name = "victim"
		return env.Client.Update(context.Background(), px) == nil
	}, 10*time.Second, 50*time.Millisecond)

	// Its entry leaves; it drains (no lease) and goes.
	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: "list"}, &cm))
	cm.Data["proxies"] = "10.5.0.2:3128\n"
	require.NoError(t, env.Client.Update(context.Background(), &cm))
	h.waitFor("list", "ready with 1", ready(1))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: own}, &corev1.Secret{}))
	}, 10*time.Second, 50*time.Millisecond, "the Secret the source made is deleted")
	var got corev1.Secret
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: "victim"}, &got), "the victim is not deleted")
	assert.Equal(t, "team's", string(got.Data["password"]))

	// A foreign Secret already where the returning member's credentials
	// belong: the member is made, the Secret is not written, the error
	// says whose it is.
	squatter := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: own, Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data: map[string][]byte{"username": []byte("x"), "password": []byte("squatter's")}}
	h.create(squatter)
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: "list"}, &cm))
	cm.Data["proxies"] = "10.5.0.1:3128:u:p\n10.5.0.2:3128\n"
	require.NoError(t, env.Client.Update(context.Background(), &cm))
	require.Eventually(t, func() bool { return h.members("list")["10.5.0.1:3128 u"] != nil }, 10*time.Second, 50*time.Millisecond)
	time.Sleep(time.Second) // several reconciles
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: own}, &got))
	assert.Equal(t, "squatter's", string(got.Data["password"]), "a Secret the source did not make is never written")
}

// A list is held to spec.maxEntries and to the proxy-address policy, and
// Synced says what was left out and why.
func TestAListIsCappedAndHeldToTheProxyAddressPolicy(t *testing.T) {
	h := startWith(t, proxysource.Options{Deny: netpolicy.DenyList{netip.MustParsePrefix("169.254.0.0/16")}})
	h.create(listMap("169.254.169.254:80\n" + lines(5, 0)))
	h.source("capped", v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "list"}}, MaxEntries: ptr.To[int32](3)})
	s := h.waitFor("capped", "ready with 3", ready(3))
	assert.Len(t, h.members("capped"), 3)
	msg := cond(s, v1.ConditionSynced).Message
	assert.Contains(t, msg, "3 entries applied; 2 more entries are past spec.maxEntries (3) and were not read")
	assert.Contains(t, msg, "line 1: 169.254.169.254 is in the proxy-address deny list (169.254.0.0/16)")
}

// A URL's user name and password are in no condition and no Event.
func TestAURLsUserinfoIsNeverShown(t *testing.T) {
	allow, err := netpolicy.ParseEgress(netpolicy.DefaultEgressDenyCIDRs, proc.SuiteAllowance, "80,443", "443")
	require.NoError(t, err)
	h := start(t, allow)
	ls := newListServer(t)
	ls.serve(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", 500) })
	u := strings.Replace(ls.URL, "http://", "http://lister:hunter2@", 1) + "/list"
	h.source("creds", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: u}})
	s := h.waitFor("creds", "failed", synced(v1.ReasonFetchFailed))
	msg := cond(s, v1.ConditionSynced).Message
	assert.Contains(t, msg, "fetching "+ls.URL+"/list: it answered 500")
	var evs eventsv1.EventList
	require.Eventually(t, func() bool {
		_ = env.Client.List(context.Background(), &evs, client.InNamespace(h.ns))
		return len(evs.Items) > 0
	}, 10*time.Second, 50*time.Millisecond)
	for _, text := range append([]string{msg}, func() (out []string) {
		for _, e := range evs.Items {
			out = append(out, e.Note)
		}
		return out
	}()...) {
		assert.NotContains(t, text, "hunter2")
		assert.NotContains(t, text, "lister")
	}
}

// A JSON list in a Secret, with per-entry attributes.
func TestAJSONListInASecret(t *testing.T) {
	h := start(t, netpolicy.Egress{})
	h.create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "bought", Labels: map[string]string{v1.LabelProxyCredentials: "true"}},
		Data: map[string][]byte{"list.json": []byte(`[{"host":"10.2.0.1","port":3128,"username":"u","password":"p","attributes":{"country":"de"}},{"host":"10.2.0.2","port":3128}]`)}})
	h.source("json", v1.ProxySourceSpec{List: &v1.SourceList{SecretRef: &v1.KeyRef{Name: "bought", Key: "list.json"}, Format: v1.FormatJSON},
		Attributes: map[string]string{"tier": "isp", "country": "us"}})
	h.waitFor("json", "ready with 2", ready(2))
	ms := h.members("json")
	assert.Equal(t, map[string]string{"tier": "isp", "country": "us"}, ms["10.2.0.1:3128 u"].Spec.Attributes, "the spec's attributes win over the list's")
	assert.Equal(t, map[string]string{"tier": "isp", "country": "us"}, ms["10.2.0.2:3128"].Spec.Attributes)
}

// Bad specs are refused by the API server, each naming what is wrong.
func TestBadSourcesAreRefused(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "badsource")
	vendor := func(mut func(*v1.SourceVendor)) v1.ProxySourceSpec {
		v := &v1.SourceVendor{Preset: v1.PresetOxylabs, Host: "pr.example", Port: 7777, Account: "a", Sessions: 1, PasswordSecretRef: v1.LocalSecretRef{Name: "p"}}
		mut(v)
		return v1.ProxySourceSpec{Vendor: v}
	}
	cases := []struct {
		name string
		spec v1.ProxySourceSpec
		want string
	}{
		{"none", v1.ProxySourceSpec{}, "exactly one of spec.list, spec.url and spec.vendor"},
		{"two", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "https://lists.example/p"}, Vendor: vendor(func(*v1.SourceVendor) {}).Vendor}, "exactly one of"},
		{"list of both", v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "a"}, SecretRef: &v1.KeyRef{Name: "b"}}}, "exactly one of configMapRef and secretRef"},
		{"ftp", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "ftp://lists.example/p"}}, "absolute http or https URL"},
		{"custom without template", vendor(func(v *v1.SourceVendor) { v.Preset = v1.PresetCustom }), "template is required"},
		{"template without custom", vendor(func(v *v1.SourceVendor) { v.Template = "x-{session}" }), "only allowed when spec.vendor.preset is Custom"},
		{"template without session", vendor(func(v *v1.SourceVendor) { v.Preset, v.Template = v1.PresetCustom, "x-{country}" }), "must contain {session}"},
		{"brightdata without zone", vendor(func(v *v1.SourceVendor) { v.Preset = v1.PresetBrightData }), "account and spec.vendor.zone are required"},
		{"apify without groups", vendor(func(v *v1.SourceVendor) { v.Preset = v1.PresetApify }), "groups is required"},
		{"bad country", vendor(func(v *v1.SourceVendor) { v.Countries = []string{"USA"} }), "countries[0]"},
		{"no sessions", vendor(func(v *v1.SourceVendor) { v.Sessions = 0 }), "sessions"},
		{"too many", vendor(func(v *v1.SourceVendor) { v.Sessions, v.Countries = 5001, []string{"us", "de"} }), "at most 10000 proxies"},
		{"timeout over a minute", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "https://l.example/", Timeout: &metav1.Duration{Duration: 2 * time.Minute}}}, "spec.url.timeout must be between 1s and 60s"},
		{"refresh too often", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "https://l.example/", RefreshInterval: &metav1.Duration{Duration: time.Second}}}, "at least 10s"},
		{"shrink over 100", v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "https://l.example/"}, MaxShrinkPercent: ptr.To[int32](101)}, "maxShrinkPercent"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := env.Client.Create(context.Background(), &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns}, Spec: c.spec})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// The samples in deploy/samples are accepted as written.
func TestSamplesAreAccepted(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "samples")
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "deploy", "samples", "proxysource_*.yaml"))
	require.NoError(t, err)
	require.Len(t, files, 3)
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, doc := range strings.Split(string(b), "\n---\n") {
			var u unstructured.Unstructured
			require.NoError(t, yaml.Unmarshal([]byte(doc), &u.Object), f)
			u.SetNamespace(ns)
			assert.NoError(t, env.Client.Create(context.Background(), &u, client.DryRunAll), "%s: %s %s", filepath.Base(f), u.GetKind(), u.GetName())
		}
	}
}

// A source in a namespace whose Secrets are not read is told so.
func TestASourceOutsideTheSecretNamespacesSaysSo(t *testing.T) {
	h := startWith(t, proxysource.Options{SecretNamespaces: []string{"crawl-a"}})
	h.create(listMap("10.1.0.1:3128\n"))
	h.source("far", v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "list"}}})
	s := h.waitFor("far", "refused", synced(v1.ReasonFetchFailed))
	assert.Empty(t, h.members("far"))
	assert.Contains(t, cond(s, v1.ConditionSynced).Message, "are not read in namespace "+h.ns+"; add it to the chart's secretNamespaces")
}

// A controller stopped and started again, with the list changed while it
// was down, finds the members it made under the same names: it creates
// none twice, adds what appeared and drains what left.
func TestARestartedControllerFindsItsMembers(t *testing.T) {
	h := start(t, netpolicy.Egress{})
	h.create(listMap(lines(4, 0)))
	h.source("list", v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "list"}}})
	h.waitFor("list", "ready with 4", ready(4))
	before := map[string]string{}
	for id, px := range h.members("list") {
		before[id] = string(px.UID)
	}
	h.stop()
	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: "list"}, &cm))
	cm.Data["proxies"] = lines(3, 2)
	require.NoError(t, env.Client.Update(context.Background(), &cm))
	h.run()
	h.waitFor("list", "ready with 3", ready(3))
	after := h.members("list")
	assert.Len(t, after, 3)
	for id, px := range after {
		if uid, ok := before[id]; ok {
			assert.Equal(t, uid, string(px.UID), "%s is the member made before the restart", id)
		}
	}
	assert.NotContains(t, after, "10.3.0.1:3128", "the entries that left are gone")
	assert.NotContains(t, after, "10.3.0.2:3128", "the entries that left are gone")
	assert.Contains(t, after, "10.3.0.5:3128", "the entry that appeared is added")
}
