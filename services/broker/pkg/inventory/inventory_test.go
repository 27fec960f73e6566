package inventory

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

func proxy(mutate func(*v1.Proxy)) *v1.Proxy {
	px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1"}}
	px.Spec.Attributes = map[string]string{"geo": "eu"}
	px.Status = v1.ProxyStatus{Phase: v1.PhaseReady, IP: "127.0.0.1", Port: 3128, Healthy: true}
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonTracking})
	meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionTrue, Reason: v1.ReasonProbeSucceeded})
	if mutate != nil {
		mutate(px)
	}
	return px
}

func TestLeasableAndWhyNot(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name   string
		mutate func(*v1.Proxy)
		reason string
	}{
		{"ready and healthy", nil, ""},
		{"unhealthy", func(px *v1.Proxy) {
			px.Status.Healthy = false
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionFalse, Reason: v1.ReasonProbeFailed})
		}, "PROXY_UNHEALTHY"},
		{"stale", func(px *v1.Proxy) {
			px.Status.Healthy = false
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionHealthy, Status: metav1.ConditionUnknown, Reason: v1.ReasonProbeStale})
		}, "PROXY_HEALTH_STALE"},
		{"deleting", func(px *v1.Proxy) { px.DeletionTimestamp = &now }, "PROXY_DELETING"},
		{"not ready", func(px *v1.Proxy) {
			meta.SetStatusCondition(&px.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Creating"})
		}, "PROXY_NOT_READY"},
		{"no address", func(px *v1.Proxy) { px.Status.IP = "" }, "PROXY_NOT_READY"},
		{"phase not Ready", func(px *v1.Proxy) { px.Status.Phase = v1.PhaseProvisioning }, "PROXY_NOT_READY"},
		{"draining", func(px *v1.Proxy) {
			px.Annotations = map[string]string{v1.AnnotationDrainDeadline: now.Add(time.Minute).UTC().Format(time.RFC3339)}
		}, "PROXY_DRAINING"},
		{"cordoned", func(px *v1.Proxy) { px.Annotations = map[string]string{v1.AnnotationCordoned: "true"} }, "PROXY_CORDONED"},
		{"cordoned but not \"true\"", func(px *v1.Proxy) { px.Annotations = map[string]string{v1.AnnotationCordoned: "yes"} }, ""},
		{"draining and cordoned: the drain says more", func(px *v1.Proxy) {
			px.Annotations = map[string]string{v1.AnnotationCordoned: "true", v1.AnnotationDrainDeadline: "soon"}
		}, "PROXY_DRAINING"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fromObject(proxy(tc.mutate))
			reason, why := p.NotLeasable()
			assert.Equal(t, tc.reason, reason)
			assert.Equal(t, tc.reason == "", p.Leasable)
			assert.Equal(t, tc.reason == "", why == "")
			assert.Equal(t, "uid-1", p.UID)
			assert.Equal(t, "ns/p", p.ID)
		})
	}
}

func TestSelectAndChanges(t *testing.T) {
	var changed []string
	inv := New(func(uid string) { changed = append(changed, uid) })
	for i, name := range []string{"c", "a", "b"} {
		px := proxy(func(px *v1.Proxy) {
			px.Name, px.UID = name, types.UID("uid-"+name)
			if i == 2 {
				px.Spec.Attributes = map[string]string{"geo": "us"}
				px.Namespace = "other"
			}
		})
		inv.Set(fromObject(px))
	}
	ids := func(ps []Proxy) (out []string) {
		for _, p := range ps {
			out = append(out, p.ID)
		}
		return out
	}
	assert.Equal(t, []string{"ns/a", "ns/c", "other/b"}, ids(inv.Select(nil, nil, nil, false)), "sorted by id")
	assert.Equal(t, []string{"ns/a", "ns/c"}, ids(inv.Select(nil, map[string]string{"geo": "eu"}, nil, false)))
	assert.Equal(t, []string{"other/b"}, ids(inv.Select([]string{"other"}, nil, nil, true)))
	inv.Delete("uid-a")
	_, ok := inv.Get("uid-a")
	assert.False(t, ok)
	assert.Equal(t, []string{"uid-c", "uid-a", "uid-b", "uid-a"}, changed, "every change is reported, by UID")
	p, _ := inv.Get("uid-c")
	assert.Equal(t, "127.0.0.1:3128", p.Addr())
}
