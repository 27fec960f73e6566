package demo

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

// up starts a system and a namespace for this test's Proxies.
func up(t *testing.T, o system.Options) (*system.System, string) {
	testenv.Require(t)
	if o.Probers == 0 {
		o.Probers = 2
	}
	if o.Brokers == 0 {
		o.Brokers = 2
	}
	if o.HealthInterval == 0 {
		o.HealthInterval = time.Second
	}
	s := system.Start(t, env, o)
	return s, env.Namespace(t, "e2e")
}

func managed(ns, name string) *v1.Proxy {
	return &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "kubernetes", Attributes: map[string]string{"geo": "local"}}}
}

// leaseOnce takes a lease in ns from the broker (its REST URL), once it
// has seen a leasable proxy there.
func leaseOnce(t *testing.T, broker, ns string) rest.Reply {
	t.Helper()
	var l rest.Reply
	require.Eventually(t, func() bool {
		l = rest.Do(t, "POST", broker+"/v1/leases", `{"namespace":"`+ns+`"}`)
		return l.Status == 200
	}, 30*time.Second, 50*time.Millisecond)
	return l
}

func waitProxy(t *testing.T, ns, name, what string, ok func(*v1.Proxy) bool) *v1.Proxy {
	t.Helper()
	var last v1.Proxy
	require.Eventually(t, func() bool {
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &last); err != nil {
			return false
		}
		return ok(&last)
	}, 60*time.Second, 50*time.Millisecond, "%s never became %s; last status %+v", name, what, last.Status)
	return &last
}

func healthy(px *v1.Proxy) bool { return px.Status.Phase == v1.PhaseReady && px.Status.Healthy }

// listed returns "ip:port" of each healthy proxy the broker lists, by id.
func listed(t *testing.T, broker string) map[string]string {
	r := rest.Do(t, "GET", broker+"/v1/proxies?healthy=true", "")
	out := map[string]string{}
	if r.Status != 200 {
		return out
	}
	for _, p := range r.JSON["proxies"].([]any) {
		m := p.(map[string]any)
		out[m["id"].(string)] = fmt.Sprintf("%s:%.0f", m["ip"], m["port"])
	}
	return out
}

func pods(t *testing.T) []corev1.Pod {
	list := &corev1.PodList{}
	require.NoError(t, env.Client.List(context.Background(), list, client.InNamespace(system.PodNamespace)))
	return list.Items
}

func podsOf(t *testing.T, px *v1.Proxy) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods(t) {
		if p.Labels["crawl.example.com/owner-uid"] == string(px.UID) {
			out = append(out, p)
		}
	}
	return out
}
