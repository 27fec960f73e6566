package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// sources brings the pool's own Squid pods in a second time, as a team
// brings in proxies it bought: their addresses and credentials, one per
// line, in a ConfigMap a ProxySource lists. The source's members turn
// Ready and Healthy through the real probe path; a lease on one hands
// its credentials; the list shrinks by that one, which drains until its
// lease is released and then goes with its credentials Secret; deleting
// the source has the cluster's garbage collector delete the rest.
func (h *harness) sources(in *install) {
	t := h.t
	ctx := context.Background()
	var lines []string
	for _, p := range h.squidPods(in) {
		if p.Status.PodIP == "" || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
			continue
		}
		user := h.secretData(in.ns, p.Name+"-squid", "username")
		pass := h.secretData(in.ns, p.Name+"-squid", "password")
		lines = append(lines, fmt.Sprintf("%s:3128:%s:%s", p.Status.PodIP, user, pass))
	}
	require.GreaterOrEqual(t, len(lines), 3, "the pool's Squid pods")
	lines = lines[:3]
	list := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: proxiesNS, Name: "bought",
		Labels: map[string]string{v1alpha1.LabelProxySource: "true"}}, Data: map[string]string{"proxies": strings.Join(lines, "\n") + "\n"}}
	require.NoError(t, h.c.Create(ctx, list))
	h.applyYAML(fmt.Sprintf(`
apiVersion: crawl.example.com/v1alpha1
kind: ProxySource
metadata: {name: bought, namespace: %s}
spec:
  list: {configMapRef: {name: bought}}
  attributes: {geo: bought}
  drainTimeout: 5m
`, proxiesNS))
	src := h.sourceAt(3, 0)
	h.logf("kubectl get psrc:\n%s", h.mustKubectl("get", "psrc", "-n", proxiesNS))
	assert.Equal(t, int32(0), src.Status.Rejected)

	// A lease on one member, which then leaves the list.
	var l *leaseclient.Lease
	c := h.leaser(in)
	h.eventually(time.Minute, "a lease on a listed proxy", func() error {
		var err error
		l, err = c.Lease(ctx, leaseclient.Request{Namespace: proxiesNS, Selector: map[string]string{"geo": "bought"}, TTL: 10 * time.Minute})
		return err
	})
	assert.NotEmpty(t, l.Credentials.GetUsername(), "the lease hands the listed credentials")
	name := strings.TrimPrefix(l.Proxy.GetId(), proxiesNS+"/")
	var leased v1alpha1.Proxy
	require.NoError(t, h.c.Get(ctx, client.ObjectKey{Namespace: proxiesNS, Name: name}, &leased))
	entry := leased.Annotations[v1alpha1.AnnotationSourceEntry]
	var kept []string
	for _, line := range lines {
		if !strings.HasPrefix(entry, strings.SplitN(line, ":", 2)[0]+":") {
			kept = append(kept, line)
		}
	}
	require.Len(t, kept, 2)
	require.NoError(t, h.c.Get(ctx, client.ObjectKeyFromObject(list), list))
	list.Data["proxies"] = strings.Join(kept, "\n") + "\n"
	require.NoError(t, h.c.Update(ctx, list))
	h.eventually(time.Minute, name+" draining", func() error {
		var px v1alpha1.Proxy
		if err := h.c.Get(ctx, client.ObjectKey{Namespace: proxiesNS, Name: name}, &px); err != nil {
			return err
		}
		if _, ok := px.DrainDeadline(); !ok {
			return fmt.Errorf("not draining")
		}
		return nil
	})
	h.logf("kubectl get psrc while %s drains:\n%s", name, h.mustKubectl("get", "psrc", "-n", proxiesNS))
	time.Sleep(8 * time.Second)
	require.NoError(t, h.c.Get(ctx, client.ObjectKey{Namespace: proxiesNS, Name: name}, &v1alpha1.Proxy{}), "%s stays while its lease lives", name)
	require.NoError(t, l.Release(ctx))
	h.sourceAt(2, 0)
	require.Error(t, h.c.Get(ctx, client.ObjectKey{Namespace: proxiesNS, Name: name}, &corev1.Secret{}), "its credentials went with it")
	var events eventsv1.EventList
	require.NoError(t, h.c.List(ctx, &events, client.InNamespace(proxiesNS)))
	reasons := map[string]bool{}
	for _, e := range events.Items {
		if e.Regarding.Kind == "ProxySource" && e.Regarding.Name == "bought" {
			reasons[e.Reason] = true
		}
	}
	for _, reason := range []string{v1alpha1.EventMemberCreated, v1alpha1.EventMemberDraining, v1alpha1.EventMemberDeleted} {
		assert.True(t, reasons[reason], "the source's Events have %s: %v", reason, reasons)
	}

	require.NoError(t, h.c.Delete(ctx, &v1alpha1.ProxySource{ObjectMeta: metav1.ObjectMeta{Namespace: proxiesNS, Name: "bought"}}))
	h.eventually(2*time.Minute, "the garbage collector deletes the source's members", func() error {
		var left v1alpha1.ProxyList
		if err := h.c.List(ctx, &left, client.InNamespace(proxiesNS), client.MatchingLabels{v1alpha1.LabelSource: "bought"}); err != nil {
			return err
		}
		if len(left.Items) > 0 {
			return fmt.Errorf("%d left", len(left.Items))
		}
		return nil
	})
}

// sourceAt waits for the source to hold n members, all healthy, with
// draining ones, and Ready when none drains.
func (h *harness) sourceAt(n, draining int32) *v1alpha1.ProxySource {
	var src v1alpha1.ProxySource
	h.eventually(3*time.Minute, fmt.Sprintf("source bought at %d healthy members", n), func() error {
		if err := h.c.Get(context.Background(), client.ObjectKey{Namespace: proxiesNS, Name: "bought"}, &src); err != nil {
			return err
		}
		st := src.Status
		if st.Desired != n || st.Present != n+draining || st.Healthy != n+draining || st.Draining != draining || (draining == 0 && !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionReady)) {
			return fmt.Errorf("status %+v", st)
		}
		return nil
	})
	return &src
}
