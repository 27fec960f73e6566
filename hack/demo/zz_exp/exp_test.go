package zzexp

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

func par(n int, f func(i int)) time.Duration {
	t := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for range 32 {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return time.Since(t)
}

func TestProfile(t *testing.T) {
	scheme := testenv.NewScheme()
	e := &envtest.Environment{BinaryAssetsDirectory: testenv.AssetsDir(), CRDDirectoryPaths: []string{testenv.CRDDir()}, Scheme: scheme}
	e.ControlPlane.GetAPIServer().Configure().Set("profiling", "true")
	cfg, err := e.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer e.Stop()
	c, _ := client.New(cfg, client.Options{Scheme: scheme})
	ctx := context.Background()
	_ = c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}})
	for range 3 {
		ca, _ := cache.New(cfg, cache.Options{Scheme: scheme})
		_, _ = ca.GetInformer(ctx, &v1.Proxy{})
		go ca.Start(ctx)
	}
	hc, _ := rest.HTTPClientFor(cfg)
	done := make(chan struct{})
	go func() {
		resp, err := hc.Get(cfg.Host + "debug/pprof/profile?seconds=12")
		if err != nil {
			t.Error(err)
			close(done)
			return
		}
		f, _ := os.Create("/tmp/apiserver.prof")
		io.Copy(f, resp.Body)
		f.Close()
		t.Log("profile", resp.Status)
		close(done)
	}()
	const n = 2000
	d := par(n, func(i int) {
		if err := c.Create(ctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "x"},
			Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: "127.0.0.1", Port: 3128, Attributes: map[string]string{"geo": "local"}}}); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("creates %s", d)
	d = par(n, func(i int) {
		px := &v1.Proxy{}
		_ = c.Get(ctx, client.ObjectKey{Namespace: "x", Name: fmt.Sprintf("p%d", i)}, px)
		base := px.DeepCopy()
		px.Status.Phase = v1.PhaseReady
		px.Status.IP = "127.0.0.1"
		px.Status.Port = 3128
		meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: "Ready", Status: "True", Reason: "Tracking", Message: "tracking external proxy at 127.0.0.1:3128"})
		if err := c.Status().Patch(ctx, px, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("patches %s", d)
	<-done
}
