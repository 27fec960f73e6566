package access_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func secret(t *testing.T, ns, name, token string) {
	t.Helper()
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, StringData: map[string]string{"token": token}}
	require.NoError(t, env.Client.Create(context.Background(), s))
}

// watch runs a registry over the Tenants of ns, rereading every 50ms.
func watch(t *testing.T, ns string, file *auth.Token) *access.Registry {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	require.NoError(t, err)
	go func() { _ = c.Start(ctx) }()
	reg := &access.Registry{File: file, Log: slog.Default()}
	require.NoError(t, reg.Watch(ctx, c, env.Client, 50*time.Millisecond))
	return reg
}

func holder(reg *access.Registry, token string) string {
	if t, ok := reg.Lookup(token); ok {
		return t.Name
	}
	return ""
}

// A rotation: the second credential is added, both work, the first is
// removed, and only the second works; a credential whose Secret changes
// takes the new token; a missing Secret is reported, and the tenant's
// other credential still works. At no step is a live credential refused.
func TestCredentialsRotateWithoutAGap(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ns := env.Namespace(t, "tenants")
	secret(t, ns, "team-a-v1", "alpha-one\n")
	tn := &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team-a"},
		Spec: v1.TenantSpec{Namespaces: []string{"crawl-a"}, Credentials: []v1.TenantCredential{{Name: "team-a-v1"}}}}
	require.NoError(t, env.Client.Create(ctx, tn))
	reg := watch(t, ns, auth.Static("root:root-secret"))
	require.True(t, reg.Enabled())
	assert.Equal(t, "team-a", holder(reg, "alpha-one"), "the token is trimmed as a file's lines are")
	assert.Equal(t, "root", holder(reg, "root-secret"), "the token file still works")

	secret(t, ns, "team-a-v2", "alpha-two")
	tn.Spec.Credentials = append(tn.Spec.Credentials, v1.TenantCredential{Name: "team-a-v2"})
	require.NoError(t, env.Client.Update(ctx, tn))
	require.Eventually(t, func() bool { return holder(reg, "alpha-two") == "team-a" }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "team-a", holder(reg, "alpha-one"), "both credentials live at once")

	tn.Spec.Credentials = tn.Spec.Credentials[1:]
	require.NoError(t, env.Client.Update(ctx, tn))
	require.Eventually(t, func() bool { return holder(reg, "alpha-one") == "" }, 5*time.Second, 10*time.Millisecond, "the removed credential stops working")
	assert.Equal(t, "team-a", holder(reg, "alpha-two"))

	// The Secret's content rotates in place.
	var s corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "team-a-v2"}, &s))
	s.Data["token"] = []byte("alpha-three")
	require.NoError(t, env.Client.Update(ctx, &s))
	require.Eventually(t, func() bool { return holder(reg, "alpha-three") == "team-a" }, 5*time.Second, 10*time.Millisecond)
	assert.Empty(t, holder(reg, "alpha-two"))

	// A credential whose Secret is missing is named; the other works.
	tn.Spec.Credentials = append(tn.Spec.Credentials, v1.TenantCredential{Name: "team-a-v3", Key: "password"})
	require.NoError(t, env.Client.Update(ctx, tn))
	require.Eventually(t, func() bool {
		d := reg.Declared()
		return len(d) == 1 && len(d[0].Missing) == 1
	}, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, reg.Declared()[0].Missing[0], ns+"/team-a-v3[password]")
	assert.Equal(t, "team-a", holder(reg, "alpha-three"))

	// A deleted Tenant's credentials stop working; the registry still
	// wants a credential (it does not fall open).
	require.NoError(t, env.Client.Delete(ctx, tn))
	require.Eventually(t, func() bool { return holder(reg, "alpha-three") == "" }, 5*time.Second, 10*time.Millisecond)
	assert.True(t, reg.Enabled())
}

// With Tenants watched and none declared, calls still need a credential.
func TestNoTenantIsNotOpen(t *testing.T) {
	testenv.Require(t)
	reg := watch(t, env.Namespace(t, "no-tenants"), nil)
	assert.True(t, reg.Enabled())
	_, ok := reg.Lookup("")
	assert.False(t, ok)
}

// statusWrites counts the Tenant status patches made through it.
type statusWrites struct {
	client.Client
	n atomic.Int32
}

func (c *statusWrites) Status() client.SubResourceWriter {
	return countedStatus{c.Client.Status(), &c.n}
}

type countedStatus struct {
	client.SubResourceWriter
	n *atomic.Int32
}

func (c countedStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	c.n.Add(1)
	return c.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// The status says whether every credential was read, the tenant's live
// leases and when a broker last served it; a credential gone turns Ready
// False naming it. One broker writes it, the leader, from what every
// broker recorded in the shared store: the tenant called only the other.
func TestStatusSaysReadyLeasesAndLastSeen(t *testing.T) {
	testenv.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := env.Namespace(t, "tenant-status")
	secret(t, ns, "team-a-v1", "alpha")
	tn := &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team-a"},
		Spec: v1.TenantSpec{Namespaces: []string{"crawl-a"}, Credentials: []v1.TenantCredential{{Name: "team-a-v1"}}}}
	require.NoError(t, env.Client.Create(ctx, tn))
	r := proc.StartRedis(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.DefaultPrefix)
	require.NoError(t, rdb.HSet(ctx, store.DefaultPrefix+store.KeyTokens.Pattern, "team-a", 3).Err(), "three live leases, as acquire.lua counts them")

	leader, follower := watch(t, ns, nil), watch(t, ns, nil)
	_, err := follower.Verify(ctx, "/grpc.health.v1.Health/Check", "alpha")
	require.NoError(t, err)
	followerClient := &statusWrites{Client: env.Client}
	for _, w := range []*access.StatusWriter{
		{Client: env.Client, Registry: leader, Fleet: st, Leading: func() bool { return true }},
		{Client: followerClient, Registry: follower, Fleet: st, Leading: func() bool { return false }},
	} {
		w.Interval, w.Log = 50*time.Millisecond, slog.Default()
		go w.Run(ctx)
	}

	var got v1.Tenant
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(tn), &got))
		return got.Status.Leases == 3 && got.Status.LastSeen != nil
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, got.Generation, got.Status.ObservedGeneration)
	assert.WithinDuration(t, time.Now(), got.Status.LastSeen.Time, 2*time.Minute, "the follower's call, through the store")
	require.Len(t, got.Status.Conditions, 1)
	assert.Equal(t, metav1.ConditionTrue, got.Status.Conditions[0].Status)

	got.Spec.Credentials = append(got.Spec.Credentials, v1.TenantCredential{Name: "team-a-v2"})
	require.NoError(t, env.Client.Update(ctx, &got))
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(tn), &got))
		return len(got.Status.Conditions) == 1 && got.Status.Conditions[0].Status == metav1.ConditionFalse
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, v1.ReasonCredentialMissing, got.Status.Conditions[0].Reason)
	assert.Contains(t, got.Status.Conditions[0].Message, ns+"/team-a-v2[token]")
	assert.Equal(t, "team-a", holder(leader, "alpha"), "the other credential works")
	assert.Zero(t, followerClient.n.Load(), "a broker that does not lead writes no status")
}

// forbidding reads Secrets through env.Client, or answers Forbidden for
// every one while forbid is set: a get grant removed.
type forbidding struct {
	client.Reader
	forbid atomic.Bool
}

func (f *forbidding) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if f.forbid.Load() {
		return apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, key.Name, errors.New("no get"))
	}
	return f.Reader.Get(ctx, key, obj, opts...)
}

// A credential whose Secret cannot be read for a reason that may pass is
// kept as last read for the grace, with Ready saying so, then refused
// (fail closed) until it is read again.
func TestAnUnreadableCredentialFailsClosedAfterTheGrace(t *testing.T) {
	testenv.Require(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ns := env.Namespace(t, "tenant-grace")
	secret(t, ns, "team-a-v1", "alpha")
	require.NoError(t, env.Client.Create(ctx, &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "team-a"},
		Spec: v1.TenantSpec{Namespaces: []string{"crawl-a"}, Credentials: []v1.TenantCredential{{Name: "team-a-v1"}}}}))
	c, err := cache.New(env.Config, cache.Options{Scheme: env.Scheme, DefaultNamespaces: map[string]cache.Config{ns: {}}})
	require.NoError(t, err)
	go func() { _ = c.Start(ctx) }()
	clk := clocktesting.NewFakePassiveClock(time.Unix(1_000_000, 0))
	secrets := &forbidding{Reader: env.Client}
	reg := &access.Registry{Log: slog.Default(), Grace: time.Minute, Clock: clk}
	require.NoError(t, reg.Watch(ctx, c, secrets, 20*time.Millisecond))
	require.Equal(t, "team-a", holder(reg, "alpha"))

	secrets.forbid.Store(true)
	require.Eventually(t, func() bool { return len(reg.Declared()[0].Unreadable) == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, "team-a", holder(reg, "alpha"), "kept as last read within the grace")
	st := access.Status(reg.Declared()[0], 0, time.Time{})
	assert.Equal(t, v1.ReasonCredentialUnreadable, st.Conditions[0].Reason)
	assert.Contains(t, st.Conditions[0].Message, "forbidden")

	clk.SetTime(clk.Now().Add(61 * time.Second))
	require.Eventually(t, func() bool { return holder(reg, "alpha") == "" }, 5*time.Second, 10*time.Millisecond, "refused after the grace")
	d := reg.Declared()[0]
	require.Len(t, d.Missing, 1)
	assert.Contains(t, d.Missing[0], "longer than the brokers' grace of 1m0s")
	assert.Equal(t, v1.ReasonCredentialMissing, access.Status(d, 0, time.Time{}).Conditions[0].Reason)

	secrets.forbid.Store(false)
	require.Eventually(t, func() bool { return holder(reg, "alpha") == "team-a" }, 5*time.Second, 10*time.Millisecond, "read again, it works again")
	assert.Empty(t, reg.Declared()[0].Unreadable)
}

// A Tenant named as a token-file line (here an unnamed line's token-1)
// would be that holder: its credentials are refused, and its status says
// why.
func TestATenantNamedAsATokenFileLineIsRefused(t *testing.T) {
	testenv.Require(t)
	ctx := context.Background()
	ns := env.Namespace(t, "tenant-clash")
	secret(t, ns, "clash-v1", "clashing-token")
	require.NoError(t, env.Client.Create(ctx, &v1.Tenant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "token-1"},
		Spec: v1.TenantSpec{Namespaces: []string{"crawl-a"}, Credentials: []v1.TenantCredential{{Name: "clash-v1"}}}}))
	reg := watch(t, ns, auth.Static("the-discovery-token"))
	assert.Equal(t, "token-1", holder(reg, "the-discovery-token"), "the file's line keeps its name")
	assert.Empty(t, holder(reg, "clashing-token"), "the clashing Tenant's credential is refused")
	d := reg.Declared()
	require.Len(t, d, 1)
	require.Len(t, d[0].Missing, 1)
	st := access.Status(d[0], 0, time.Time{})
	assert.Equal(t, v1.ReasonCredentialMissing, st.Conditions[0].Reason)
	assert.Contains(t, st.Conditions[0].Message, `the Tenant's name "token-1" is the name of a line of the brokers' token file`)
}
