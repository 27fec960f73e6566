package memberset_test

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func member(ns, name string) *v1.Proxy {
	return &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"set": "a"}},
		Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: "127.0.0.1", Port: 3128}}
}

// A set carries out a plan on a real API server through a manager's
// cached client: every member it creates is its owner's, what must come
// first does, a create that finds its member already there counts as
// written and not created, one failing create stops no other; drains
// mark and undrains take the mark back; a delete deletes the member read
// (not one re-created under its name) and then what goes with it; each
// change is told to Done and in an Event on the owner; Members finds the
// owner's and every taken name.
func TestASetCarriesOutAPlan(t *testing.T) {
	testenv.Require(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	ns := env.Namespace(t, "memberset")
	mgr := env.Manager(t, ns, nil)
	go func() { _ = mgr.Start(ctx) }()
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))
	c := mgr.GetClient()

	owner := &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owner"},
		Spec: v1.ProxySourceSpec{List: &v1.SourceList{ConfigMapRef: &v1.KeyRef{Name: "none"}}}}
	require.NoError(t, c.Create(ctx, owner))
	stranger := member(ns, "stranger")
	require.NoError(t, c.Create(ctx, stranger))

	var done []string
	set := &memberset.Set{Client: c, Recorder: mgr.GetEventRecorder("memberset-test"), Owner: owner, Wait: true, Workers: 4,
		Done: func(a memberset.Action, cause string) { done = append(done, string(a)+"/"+cause) }}
	var before atomic.Int32
	first := func(context.Context) error { before.Add(1); return nil }
	require.NoError(t, set.Apply(ctx, memberset.Plan{Create: []memberset.Change{
		{Member: member(ns, "m-0"), Why: "for a", Cause: "new", Before: first},
		{Member: member(ns, "m-1"), Why: "for b", Cause: "new"},
	}}))
	members, taken, err := memberset.Members(ctx, c, owner, client.MatchingLabels{"set": "a"})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"m-0", "m-1"}, keys(members), "the owner's members, not the stranger")
	assert.True(t, taken["stranger"], "every name in the namespace is taken")
	assert.True(t, metav1.IsControlledBy(members["m-0"], owner), "created owned")
	assert.EqualValues(t, 1, before.Load())

	// A retry on the same view, and a create whose first step fails.
	err = set.Apply(ctx, memberset.Plan{Create: []memberset.Change{
		{Member: member(ns, "m-0"), Why: "again", Cause: "retry"},
		{Member: member(ns, "m-2"), Why: "doomed", Cause: "new", Before: func(context.Context) error { return errors.New("no credentials") }},
		{Member: member(ns, "m-3"), Why: "for c", Cause: "new"},
	}})
	require.ErrorContains(t, err, "member m-2: no credentials")
	members, _, err = memberset.Members(ctx, c, owner)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"m-0", "m-1", "m-3"}, keys(members), "m-2 not made; m-3 made anyway")

	until := memberset.DrainDeadline(time.Now(), time.Minute)
	require.NoError(t, set.Apply(ctx, memberset.Plan{DrainUntil: until, Drain: []memberset.Change{{Member: members["m-1"], Why: "it left", Cause: "gone"}}}))
	var got v1.Proxy
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(members["m-1"]), &got))
	d, ok := got.DrainDeadline()
	require.True(t, ok)
	assert.Equal(t, until.UTC(), d.UTC())
	require.NoError(t, set.Apply(ctx, memberset.Plan{Undrain: []memberset.Change{{Member: &got, Why: "it is back"}}}))
	require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(&got), &got))
	_, ok = got.DrainDeadline()
	assert.False(t, ok, "the drain is taken back")

	var after []string
	stale := members["m-3"].DeepCopy()
	require.NoError(t, c.Delete(ctx, members["m-3"]))
	require.NoError(t, c.Create(ctx, member(ns, "m-3")), "m-3 re-created under its name since it was read")
	require.NoError(t, set.Apply(ctx, memberset.Plan{Delete: []memberset.Change{
		{Member: members["m-0"], Why: "drained", Cause: "drained", After: func(context.Context) error { after = append(after, "m-0"); return nil }},
	}}))
	err = set.Apply(ctx, memberset.Plan{Delete: []memberset.Change{{Member: stale, Why: "stale"}}})
	assert.ErrorContains(t, err, "deleting member m-3", "the new m-3 is not the member read: the UID precondition refuses")
	assert.Equal(t, []string{"m-0"}, after)
	members, _, err = memberset.Members(ctx, c, owner)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"m-1"}, keys(members))

	assert.Equal(t, []string{"create/new", "create/new", "create/new", "drain/gone", "undrain/", "delete/drained"}, done)
	require.Eventually(t, func() bool {
		var evs corev1.EventList
		require.NoError(t, env.Client.List(ctx, &evs, client.InNamespace(ns)))
		reasons := map[string]bool{}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "owner" {
				reasons[e.Reason] = true
			}
		}
		return reasons[v1.EventMemberCreated] && reasons[v1.EventMemberDraining] && reasons[v1.EventMemberUndrained] && reasons[v1.EventMemberDeleted]
	}, 10*time.Second, 50*time.Millisecond, "an Event on the owner for each kind of change")
}

func keys(m map[string]*v1.Proxy) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
