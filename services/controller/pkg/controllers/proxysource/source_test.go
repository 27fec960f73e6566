package proxysource_test

import (
	"context"
	"encoding/pem"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxy/lifecycle"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/controllers/proxysource"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// leases is the lease view the tests set by hand, in place of the
// broker's (the end-to-end suite runs the real one).
type leases struct {
	mu sync.Mutex
	m  map[string]int32
}

func (l *leases) Snapshot() leaseview.Snapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	return leaseview.Snapshot{At: time.Now(), Leases: maps.Clone(l.m)}
}

func (l *leases) set(id string, n int32) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.m[id] = n
}

// harness runs the Proxy lifecycle (External members turn Ready at their
// address) and the ProxySource reconciler on the shared API server, in a
// namespace of its own; a stand-in prober marks every Ready member
// Healthy.
type harness struct {
	t      *testing.T
	ns     string
	leases *leases
	opts   proxysource.Options
	stop   func()
}

func start(t *testing.T, egress netpolicy.Egress) *harness {
	return startWith(t, proxysource.Options{Egress: egress})
}

func startWith(t *testing.T, opts proxysource.Options) *harness {
	testenv.Require(t)
	opts.MarkLag = 200 * time.Millisecond
	h := &harness{t: t, ns: env.Namespace(t, "source"), leases: &leases{m: map[string]int32{}}, opts: opts}
	h.run()
	return h
}

// run starts a manager with the lifecycle and source reconcilers, until
// stop or the test's end.
func (h *harness) run() {
	t := h.t
	ctx, cancel := context.WithCancel(context.Background())
	mgr := env.Manager(t, h.ns, nil)
	reg, err := providers.NewRegistry(ctx, nil, nil, providers.Deps{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Log: slog.Default()})
	require.NoError(t, err)
	require.NoError(t, lifecycle.New(mgr.GetClient(), reg, mgr.GetEventRecorder("test"), slog.Default(), lifecycle.Options{
		PollInterval: 100 * time.Millisecond, ResyncInterval: time.Hour, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second,
	}).SetupWithManager(ctx, mgr))
	require.NoError(t, proxysource.New(mgr.GetClient(), mgr.GetCache(), h.leases, mgr.GetEventRecorder("test"), slog.Default(), h.opts).SetupWithManager(mgr))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	go h.prober(ctx)
	h.stop = func() { cancel(); <-done }
	t.Cleanup(h.stop)
}

// prober marks Ready members Healthy, as the probe fleet would.
func (h *harness) prober(ctx context.Context) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		var list v1.ProxyList
		if err := env.Client.List(ctx, &list, client.InNamespace(h.ns)); err == nil {
			for _, px := range list.Items {
				if !px.IsReady() || px.Status.Healthy || !px.DeletionTimestamp.IsZero() {
					continue
				}
				px.Status.Healthy, px.Status.HealthInstanceGeneration = true, px.Status.InstanceGeneration
				meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded, Message: "stand-in"})
				_ = env.Client.Status().Update(ctx, &px)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (h *harness) create(objs ...client.Object) {
	h.t.Helper()
	for _, o := range objs {
		o.SetNamespace(h.ns)
		require.NoError(h.t, env.Client.Create(context.Background(), o))
	}
}

func (h *harness) source(name string, spec v1.ProxySourceSpec) *v1.ProxySource {
	s := &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	h.create(s)
	return s
}

func (h *harness) get(name string) *v1.ProxySource {
	h.t.Helper()
	s := &v1.ProxySource{}
	require.NoError(h.t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: h.ns, Name: name}, s))
	return s
}

// members are the source's Proxies, by the entry they were made for.
func (h *harness) members(name string) map[string]*v1.Proxy {
	var list v1.ProxyList
	require.NoError(h.t, env.Client.List(context.Background(), &list, client.InNamespace(h.ns), client.MatchingLabels{v1.LabelSource: name}))
	out := map[string]*v1.Proxy{}
	for i := range list.Items {
		out[list.Items[i].Annotations[v1.AnnotationSourceEntry]] = &list.Items[i]
	}
	return out
}

// refresh has the source fetch its URL again now.
func (h *harness) refresh(name string) {
	h.t.Helper()
	require.Eventually(h.t, func() bool {
		s := h.get(name)
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[v1.AnnotationRefresh] = time.Now().Format(time.RFC3339Nano)
		return env.Client.Update(context.Background(), s) == nil
	}, 10*time.Second, 20*time.Millisecond)
}

// waitFor waits until the source's status satisfies ok, and returns it.
func (h *harness) waitFor(name, what string, ok func(*v1.ProxySource) bool) *v1.ProxySource {
	h.t.Helper()
	var s *v1.ProxySource
	if !assert.Eventually(h.t, func() bool { s = h.get(name); return ok(s) }, 30*time.Second, 50*time.Millisecond) {
		var list v1.ProxyList
		_ = env.Client.List(context.Background(), &list, client.InNamespace(h.ns))
		for _, px := range list.Items {
			h.t.Logf("member %s %v: %+v", px.Name, px.Annotations, px.Status)
		}
		h.t.Fatalf("source %s never became %s: %+v", name, what, s.Status)
	}
	return s
}

func cond(s *v1.ProxySource, typ string) *metav1.Condition {
	return meta.FindStatusCondition(s.Status.Conditions, typ)
}

func synced(reason string) func(*v1.ProxySource) bool {
	return func(s *v1.ProxySource) bool {
		c := cond(s, v1.ConditionSynced)
		return c != nil && c.Reason == reason && c.ObservedGeneration == s.Generation
	}
}

func ready(desired int32) func(*v1.ProxySource) bool {
	return func(s *v1.ProxySource) bool {
		return s.Status.Desired == desired && s.Status.Healthy == desired && s.Status.Present == desired && meta.IsStatusConditionTrue(s.Status.Conditions, v1.ConditionReady)
	}
}

func listMap(data string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "list", Labels: map[string]string{v1.LabelProxySource: "true"}},
		Data: map[string]string{"proxies": data}}
}

func identities(m map[string]*v1.Proxy) []string {
	return slices.Sorted(maps.Keys(m))
}

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
