package uninstall_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/uninstall"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

const finalizer = "test.crawl.example.com/instance"

// proxy makes a Proxy with a finalizer, as the controller's would be.
func proxy(t *testing.T, ns, name string) *v1.Proxy {
	t.Helper()
	px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Finalizers: []string{finalizer}},
		Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "kubernetes"}}
	require.NoError(t, env.Client.Create(context.Background(), px))
	return px
}

// release plays the controller: it removes the finalizer of every
// Proxy that is being deleted, as it would once the instance is gone.
func release(ctx context.Context, t *testing.T, ns string) {
	for ctx.Err() == nil {
		var l v1.ProxyList
		if env.Client.List(ctx, &l, client.InNamespace(ns)) == nil {
			for i := range l.Items {
				if px := &l.Items[i]; px.DeletionTimestamp != nil {
					px.Finalizers = nil
					_ = env.Client.Update(ctx, px)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestDeletesPoolsAndProxiesAndWaitsForTheirInstances(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "uninstall")
	pool := &v1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "pool"},
		Spec: v1.ProxyPoolSpec{Replicas: ptr.To[int32](0), Template: v1.ProxyTemplate{Spec: v1.ProxyTemplateSpec{Provider: "kubernetes"}}}}
	require.NoError(t, env.Client.Create(context.Background(), pool))
	source := &v1.ProxySource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "source"},
		Spec: v1.ProxySourceSpec{URL: &v1.SourceURL{URL: "https://lists.example/proxies"}}}
	require.NoError(t, env.Client.Create(context.Background(), source))
	proxy(t, ns, "a")
	proxy(t, ns, "b")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- (&uninstall.Cleaner{Client: scoped{env.Client, ns}, Log: slog.Default(), Timeout: time.Minute, Poll: 20 * time.Millisecond}).Run(ctx)
	}()
	// It waits while the instances are being deleted...
	require.Eventually(t, func() bool {
		var px v1.Proxy
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &px) == nil && px.DeletionTimestamp != nil
	}, 10*time.Second, 10*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("returned before the Proxies were gone: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	assert.True(t, apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(pool), &v1.ProxyPool{})), "the pool went first")
	assert.True(t, apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(source), &v1.ProxySource{})), "and the source")
	// ...and returns once they are gone.
	go release(ctx, t, ns)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("never returned")
	}
	var l v1.ProxyList
	require.NoError(t, env.Client.List(ctx, &l, client.InNamespace(ns)))
	assert.Empty(t, l.Items)
}

func TestAProxyThatOutlivesTheTimeoutFailsTheUninstallAndSaysWhy(t *testing.T) {
	testenv.Require(t)
	ns := env.Namespace(t, "uninstall-stuck")
	proxy(t, ns, "stuck")
	err := (&uninstall.Cleaner{Client: scoped{env.Client, ns}, Log: slog.Default(), Timeout: 300 * time.Millisecond, Poll: 20 * time.Millisecond}).Run(context.Background())
	var left *uninstall.LeftError
	require.ErrorAs(t, err, &left)
	assert.Equal(t, 1, left.Left)
	assert.ErrorContains(t, err, ns+"/stuck")
	assert.ErrorContains(t, err, "leave them running with nobody to delete them")
	assert.ErrorContains(t, err, v1.AnnotationSkipCleanup)
}

// scoped confines the cleaner to one namespace: the API server is shared
// with the rest of the package's tests.
type scoped struct {
	client.Client
	ns string
}

func (s scoped) List(ctx context.Context, l client.ObjectList, opts ...client.ListOption) error {
	return s.Client.List(ctx, l, append(opts, client.InNamespace(s.ns))...)
}
