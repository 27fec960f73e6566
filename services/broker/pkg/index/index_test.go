package index_test

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/broker/internal/brokertest"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestKeyIsCanonical(t *testing.T) {
	a := index.Selector{Scope: "s", Namespaces: []string{"n"}, Labels: map[string]string{"geo": "eu", "tier": "a"}}
	b := index.Selector{Scope: "s", Namespaces: []string{"n"}, Labels: map[string]string{"tier": "a", "geo": "eu"}}
	assert.Equal(t, a.Key(), b.Key(), "label order does not matter")
	for _, other := range []index.Selector{
		{Scope: "t", Namespaces: []string{"n"}, Labels: a.Labels},
		{Scope: "s", Namespaces: []string{"m"}, Labels: a.Labels},
		{Scope: "s", Namespaces: []string{"m", "n"}, Labels: a.Labels},
		{Scope: "s", Labels: a.Labels},
		{Scope: "s", Namespaces: []string{"n"}, Labels: map[string]string{"geo": "eu"}},
		{Scope: "s", Namespaces: []string{"n"}, Labels: map[string]string{"geo": "eu", "tier": "b"}},
		{Scope: "s", Namespaces: []string{"n"}, Labels: map[string]string{"geo": "eutier", "": "a"}},
	} {
		assert.NotEqual(t, a.Key(), other.Key(), "%+v", other)
	}
}

func setStatus(t *testing.T, ns, name string, mutate func(*v1.Proxy)) {
	t.Helper()
	var px v1.Proxy
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &px))
	mutate(&px)
	require.NoError(t, env.Client.Status().Update(context.Background(), &px))
}

func unhealthy(px *v1.Proxy) {
	px.Status.Healthy = false
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1.ReasonProbeFailed, Message: "test"})
}

// TestIndexFollowsTheFleet: an index holds exactly the leasable proxies
// its selector matches, as they change, and a deleted proxy's state goes.
func TestIndexFollowsTheFleet(t *testing.T) {
	s := brokertest.New(t, env, nil)
	a := s.Proxy(t, "a", "127.0.0.41", map[string]string{"geo": "eu"})
	b := s.Proxy(t, "b", "127.0.0.42", map[string]string{"geo": "eu"})
	c := s.Proxy(t, "c", "127.0.0.43", map[string]string{"geo": "us"})
	ctx := context.Background()
	key, err := s.Index.Ensure(ctx, index.Selector{Labels: map[string]string{"geo": "eu"}})
	require.NoError(t, err)
	all, err := s.Index.Ensure(ctx, index.Selector{})
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{a.UID, b.UID}, s.Members(t, key))
	assert.ElementsMatch(t, []string{a.UID, b.UID, c.UID}, s.Members(t, all))

	setStatus(t, s.NS, "a", unhealthy)
	var px v1.Proxy
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: s.NS, Name: "c"}, &px))
	px.Spec.Attributes = map[string]string{"geo": "eu"}
	require.NoError(t, env.Client.Update(ctx, &px))
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual(sorted([]string{b.UID, c.UID}), sorted(s.Members(t, key))) &&
			assert.ObjectsAreEqual(sorted([]string{b.UID, c.UID}), sorted(s.Members(t, all)))
	}, 10*time.Second, 20*time.Millisecond, "unhealthy a left both indexes, c joined eu")

	require.NoError(t, env.Client.Delete(ctx, &px))
	require.Eventually(t, func() bool {
		known, err := s.Store.Known(ctx)
		require.NoError(t, err)
		_, ok := known[c.UID]
		return !ok
	}, 10*time.Second, 20*time.Millisecond, "the deleted proxy is forgotten")
	assert.Equal(t, []string{b.UID}, s.Members(t, key))
}

func sorted(s []string) []string { return slices.Sorted(slices.Values(s)) }

// TestResyncRepairsAndCollects: a resync puts back a member Redis lost,
// and forgets a proxy of the broker's namespace that no longer exists
// (deleted while no broker watched), but only at the second resync, and
// never one of another namespace.
func TestResyncRepairsAndCollects(t *testing.T) {
	s := brokertest.New(t, env, func(m *index.Maintainer) { m.Resync = 200 * time.Millisecond })
	a := s.Proxy(t, "a", "127.0.0.51", nil)
	ctx := context.Background()
	key, err := s.Index.Ensure(ctx, index.Selector{})
	require.NoError(t, err)
	require.NoError(t, s.Store.Leave(ctx, a.UID, key))
	require.NoError(t, s.Store.Join(ctx, "", []store.Member{{UID: "ghost", Namespace: s.NS}, {UID: "elsewhere", Namespace: "other"}}, []string{key}))
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]string{a.UID}, s.Members(t, key))
	}, 10*time.Second, 20*time.Millisecond, "the resync put a back and took the ghost out")
	require.Eventually(t, func() bool {
		known, err := s.Store.Known(ctx)
		require.NoError(t, err)
		_, ghost := known["ghost"]
		_, elsewhere := known["elsewhere"]
		return !ghost && elsewhere
	}, 10*time.Second, 20*time.Millisecond, "the ghost is forgotten; another namespace's proxy is not this broker's to forget")
}

func TestIdleAndSurplusIndexesAreDropped(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := brokertest.New(t, env, func(m *index.Maintainer) {
		m.Resync, m.Idle, m.MaxIndexes, m.Clock = 100*time.Millisecond, time.Hour, 2, clk
	})
	s.Proxy(t, "a", "127.0.0.61", map[string]string{"geo": "eu", "tier": "x"})
	ctx := context.Background()
	var keys []string
	for _, sel := range []map[string]string{{"geo": "eu"}, {"tier": "x"}, {}} {
		key, err := s.Index.Ensure(ctx, index.Selector{Labels: sel})
		require.NoError(t, err)
		keys = append(keys, key)
		clk.Step(time.Second) // uses a second apart: the first is the least recent
	}
	ixs := func() map[string]store.Index {
		m, err := s.Store.Indexes(ctx)
		require.NoError(t, err)
		return m
	}
	require.Eventually(t, func() bool {
		m := ixs()
		_, first := m[keys[0]]
		return len(m) == 2 && !first
	}, 5*time.Second, 20*time.Millisecond, "over the limit of 2, the least recently used went first")
	require.Never(t, func() bool { return len(ixs()) < 2 }, 500*time.Millisecond, 20*time.Millisecond, "in use within --index-idle, they stay")
	clk.Step(time.Hour)
	require.Eventually(t, func() bool { return len(ixs()) == 0 }, 10*time.Second, 20*time.Millisecond, "unused, the others go after --index-idle")
	key, err := s.Index.Ensure(ctx, index.Selector{})
	require.NoError(t, err)
	assert.Len(t, s.Members(t, key), 1, "a dropped index is rebuilt on use")
}
