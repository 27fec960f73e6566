package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

func TestQuickstart(t *testing.T) {
	s, ns := up(t, system.Options{})
	require.NoError(t, env.Client.Create(context.Background(), managed(ns, "proxy-kubernetes-sample")))
	px := waitProxy(t, ns, "proxy-kubernetes-sample", "Ready and Healthy", healthy)
	assert.Equal(t, px.Status.IP, px.Status.EgressIP, "the probe target echoed the Squid's outgoing address: the pod's own")
	b0, b1 := s.Brokers[0].REST, s.Brokers[1].REST
	id := ns + "/proxy-kubernetes-sample"
	require.Eventually(t, func() bool { return listed(t, b0)[id] != "" && listed(t, b1)[id] != "" }, 30*time.Second, 50*time.Millisecond)

	list := rest.Do(t, "GET", b0+"/v1/proxies?healthy=true&geo=local&namespace="+ns, "")
	require.Equal(t, 200, list.Status)
	ps := list.JSON["proxies"].([]any)
	require.Len(t, ps, 1)
	p := ps[0].(map[string]any)
	assert.Equal(t, px.Status.IP, p["ip"])
	assert.Equal(t, float64(3128), p["port"])

	lease := rest.Do(t, "POST", b0+"/v1/leases", `{"selector":{"geo":"local"},"ttlSeconds":300,"namespace":"`+ns+`"}`)
	require.Equal(t, 200, lease.Status, string(lease.Body))
	leaseID := lease.JSON["leaseID"].(string)
	assert.Equal(t, id, lease.JSON["proxy"].(map[string]any)["id"])

	// The leased proxy really egresses: fetch the target through it.
	tr := &http.Transport{Proxy: http.ProxyURL(mustURL("http://" + px.Status.IP + ":3128")), TLSClientConfig: tlsTo(s)}
	resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(s.Target.URL + "/ip")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, px.Status.IP, strings.TrimSpace(string(body)), "the pod's Squid egresses from its own address")

	rep := rest.Do(t, "POST", b1+"/v1/leases/"+leaseID+"/report", `{"result":"rate_limited","target":"example.com"}`)
	assert.Equal(t, 200, rep.Status, "the other broker sees the lease: %s", rep.Body)
	none := rest.Do(t, "POST", b0+"/v1/leases", `{"namespace":"`+ns+`","target":"example.com"}`)
	assert.Equal(t, 429, none.Status, "the only proxy cools down for example.com")
	assert.Contains(t, string(none.Body), "ALL_COOLING_DOWN")
	assert.Equal(t, 204, rest.Do(t, "DELETE", b0+"/v1/leases/"+leaseID, "").Status)
	assert.Equal(t, 204, rest.Do(t, "DELETE", b1+"/v1/leases/"+leaseID, "").Status)
}

func TestReplacementGivesANewIPAndClientsNeverSeeTheOldOneAgain(t *testing.T) {
	s, ns := up(t, system.Options{})
	require.NoError(t, env.Client.Create(context.Background(), managed(ns, "r")))
	before := waitProxy(t, ns, "r", "Ready and Healthy", healthy)
	id := ns + "/r"
	old := fmt.Sprintf("%s:%d", before.Status.IP, before.Status.Port)

	// A client polls the list throughout the replacement.
	var mu sync.Mutex
	var seen []string
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			addr := listed(t, s.Brokers[0].REST)[id]
			mu.Lock()
			if n := len(seen); n == 0 || seen[n-1] != addr {
				seen = append(seen, addr)
			}
			mu.Unlock()
		}
	}()
	px := before.DeepCopy()
	px.Spec.Port = 8080
	require.NoError(t, env.Client.Update(context.Background(), px))
	after := waitProxy(t, ns, "r", "replaced, Ready and Healthy", func(p *v1.Proxy) bool { return p.Status.InstanceGeneration == 2 && healthy(p) })
	require.Eventually(t, func() bool { return listed(t, s.Brokers[0].REST)[id] == fmt.Sprintf("%s:8080", after.Status.IP) }, 30*time.Second, 50*time.Millisecond)
	close(stop)
	wg.Wait()

	assert.NotEqual(t, before.Status.IP, after.Status.IP, "a replacement has a new IP")
	assert.Equal(t, int32(8080), after.Status.Port)
	mu.Lock()
	defer mu.Unlock()
	gone := false
	for _, a := range seen {
		if a != old {
			gone = true
		}
		if gone {
			assert.NotEqual(t, old, a, "the old address came back after it was gone: %v", seen)
		}
	}
	assert.Len(t, podsOf(t, after), 1, "exactly one pod after the replacement")
}

func TestDeletingRemovesThePodEvenWhenTheControllerDiesMidCreate(t *testing.T) {
	s, ns := up(t, system.Options{GCInterval: time.Second, GCGrace: 2 * time.Second})
	ctx := context.Background()

	require.NoError(t, env.Client.Create(ctx, managed(ns, "d")))
	px := waitProxy(t, ns, "d", "Ready", healthy)
	require.Len(t, podsOf(t, px), 1)
	require.NoError(t, env.Client.Delete(ctx, px))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(px), &v1.Proxy{})) && len(podsOf(t, px)) == 0
	}, 30*time.Second, 50*time.Millisecond, "deleting the Proxy deletes its pod")

	// Mid-create: the controller dies once the pod exists; the Proxy is
	// deleted while it is down; the restarted controller cleans up.
	require.NoError(t, env.Client.Create(ctx, managed(ns, "m")))
	var m v1.Proxy
	require.Eventually(t, func() bool {
		_ = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "m"}, &m)
		return m.UID != "" && len(podsOf(t, &m)) == 1
	}, 30*time.Second, 20*time.Millisecond)
	s.Controllers[0].Proc.Kill()
	require.NoError(t, env.Client.Delete(ctx, &m))
	s.StartController(0)
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(&m), &v1.Proxy{})) && len(podsOf(t, &m)) == 0
	}, 60*time.Second, 100*time.Millisecond, "the restarted controller left the pod of a Proxy deleted mid-create")

	// An instance whose create was never recorded (the status write lost
	// with the crash) is orphan GC's: its owner UID is gone.
	orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "px-lost-deadbeef-1", Namespace: system.PodNamespace, Labels: map[string]string{
		"app.kubernetes.io/managed-by": "egress-proxies", "crawl.example.com/provider": "kubernetes",
		"crawl.example.com/owner-uid": string(m.UID), "crawl.example.com/instance-generation": "1"},
		Annotations: map[string]string{"crawl.example.com/owner": ns + "/m"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "squid", Image: "ubuntu/squid"}}}}
	require.NoError(t, env.Client.Create(ctx, orphan))
	require.Eventually(t, func() bool {
		return apierrors.IsNotFound(env.Client.Get(ctx, client.ObjectKeyFromObject(orphan), &corev1.Pod{}))
	}, 30*time.Second, 100*time.Millisecond, "orphan GC never collected the pod")
}

func TestBrokerKilledUnderTrafficLosesNoLease(t *testing.T) {
	s, ns := up(t, system.Options{Brokers: 2, Probers: 1})
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		require.NoError(t, env.Client.Create(ctx, managed(ns, n)))
	}
	waitProxy(t, ns, "a", "healthy", healthy)
	waitProxy(t, ns, "b", "healthy", healthy)
	for _, b := range s.Brokers {
		require.Eventually(t, func() bool { return len(listed(t, b.REST)) >= 2 }, 30*time.Second, 50*time.Millisecond)
	}

	var mu sync.Mutex
	granted := map[string]string{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	// Each worker asks for leases as a client should: with a requestId,
	// retried on the other broker when a call fails. A lease Redis granted
	// as its broker died is then handed to the retry, not orphaned, so
	// the counts below are exact.
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				body := fmt.Sprintf(`{"ttlSeconds":600,"namespace":%q,"requestId":"w%d-%d"}`, ns, w, i)
				var resp *http.Response
				for attempt := 0; attempt < 20; attempt++ {
					var err error
					resp, err = http.Post(s.Brokers[(w+attempt)%2].REST+"/v1/leases", "application/json", strings.NewReader(body))
					if err == nil {
						break // answered; else the killed broker: the same request, the other broker
					}
					time.Sleep(10 * time.Millisecond)
				}
				if resp == nil {
					continue
				}
				var l map[string]any
				_ = json.NewDecoder(resp.Body).Decode(&l)
				_ = resp.Body.Close()
				if resp.StatusCode == 200 {
					mu.Lock()
					granted[l["leaseID"].(string)] = l["proxy"].(map[string]any)["id"].(string)
					mu.Unlock()
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	time.Sleep(time.Second)
	s.Brokers[0].Proc.Kill() // SIGKILL mid-traffic
	wg.Wait()
	s.StartBroker(0)

	counts := map[string]int{}
	for _, p := range granted {
		counts[p]++
	}
	require.NotEmpty(t, granted)
	for id, p := range granted {
		r := rest.Do(t, "POST", s.Brokers[0].REST+"/v1/leases/"+id+"/renew", `{}`)
		assert.Equal(t, 200, r.Status, "lease %s on %s was granted before the kill and must still be valid", id, p)
	}
	list := rest.Do(t, "GET", s.Brokers[0].REST+"/v1/proxies?namespace="+ns, "")
	for _, p := range list.JSON["proxies"].([]any) {
		m := p.(map[string]any)
		n := int(m["leaseCount"].(float64))
		assert.Equal(t, counts[m["id"].(string)], n, "lease count of %s is exact", m["id"])
		assert.LessOrEqual(t, n, 10, "no proxy past the cap")
	}
}

func TestSquidKilledLeavesTheCandidatesAndComesBack(t *testing.T) {
	s, ns := up(t, system.Options{})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, managed(ns, "k")))
	px := waitProxy(t, ns, "k", "healthy", healthy)
	b := s.Brokers[0].REST
	require.Eventually(t, func() bool {
		return rest.Do(t, "POST", b+"/v1/leases", `{"ttlSeconds":10,"namespace":"`+ns+`"}`).Status == 200
	}, 30*time.Second, 50*time.Millisecond)

	// Kill the Squid the kubelet stand-in runs for the pod.
	squid := s.Kubelet.Squid(string(podsOf(t, px)[0].UID))
	require.NotNil(t, squid)
	squid.Kill()
	waitProxy(t, ns, "k", "Unhealthy", func(p *v1.Proxy) bool { return !p.Status.Healthy })
	require.Eventually(t, func() bool {
		return rest.Do(t, "POST", b+"/v1/leases", `{"ttlSeconds":10,"namespace":"`+ns+`"}`).Status == 429
	}, 30*time.Second, 50*time.Millisecond, "an Unhealthy proxy is no lease candidate")

	squid.Start()
	waitProxy(t, ns, "k", "healthy again", healthy)
	require.Eventually(t, func() bool {
		return rest.Do(t, "POST", b+"/v1/leases", `{"ttlSeconds":10,"namespace":"`+ns+`"}`).Status == 200
	}, 30*time.Second, 50*time.Millisecond)
}

func TestRedisRestartedBrokersRecoverWithStateIntact(t *testing.T) {
	s, ns := up(t, system.Options{Probers: 1})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, managed(ns, "x")))
	waitProxy(t, ns, "x", "healthy", healthy)
	b := s.Brokers[1].REST
	l := leaseOnce(t, b, ns)
	s.Redis.Kill()
	assert.Equal(t, 503, rest.Do(t, "POST", b+"/v1/leases", `{"namespace":"`+ns+`"}`).Status)
	s.Redis.Start()
	require.Eventually(t, func() bool {
		return rest.Do(t, "POST", b+"/v1/leases/"+l.JSON["leaseID"].(string)+"/renew", `{}`).Status == 200
	}, 30*time.Second, 100*time.Millisecond, "the lease from before the restart is intact")
	for _, br := range s.Brokers {
		assert.False(t, br.Proc.Exited())
	}
}

func TestBadInputAtTheEdgesChangesNothing(t *testing.T) {
	s, ns := up(t, system.Options{Probers: 1, Brokers: 1})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, managed(ns, "v")))
	waitProxy(t, ns, "v", "healthy", healthy)
	b := s.Brokers[0].REST
	leaseOnce(t, b, ns)
	before := rest.Do(t, "GET", b+"/v1/proxies?namespace="+ns, "").Body

	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/leases", `{"selector":`},
		{"POST", "/v1/leases", `{"bogus":1}`},
		{"POST", "/v1/leases", `{"ttlSeconds":-1}`},
		{"POST", "/v1/leases", `{"ttlSeconds":99999999}`},
		{"POST", "/v1/leases", strings.Repeat("x", 10<<20)},
		{"DELETE", "/v1/leases/..%2f..%2fetc%2fpasswd", ""},
		{"POST", "/v1/leases/" + strings.Repeat("0", 32) + "/report", `{"result":"ok"}`},
	} {
		r := rest.Do(t, c.method, b+c.path, c.body)
		assert.GreaterOrEqual(t, r.Status, 400, "%s %s", c.method, c.path)
		assert.Less(t, r.Status, 500, "%s %s: %s", c.method, c.path, r.Body)
	}
	assert.JSONEq(t, string(before), string(rest.Do(t, "GET", b+"/v1/proxies?namespace="+ns, "").Body), "lease counts unchanged")

	bad := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns}, Spec: v1.ProxySpec{Mode: v1.ModeExternal, Port: 70000}}
	err := env.Client.Create(ctx, bad)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "spec.port")
	list := &v1.ProxyList{}
	require.NoError(t, env.Client.List(ctx, list, client.InNamespace(ns)))
	assert.Len(t, list.Items, 1, "nothing was created")

}

func TestAPIServerUnreachableForAWhile(t *testing.T) {
	s, ns := up(t, system.Options{Probers: 1, CuttableAPIServer: true})
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, managed(ns, "before")))
	waitProxy(t, ns, "before", "healthy", healthy)
	b := s.Brokers[0].REST
	require.Eventually(t, func() bool { return listed(t, b)[ns+"/before"] != "" }, 30*time.Second, 50*time.Millisecond)

	s.APILink.Cut()
	// While cut off, the world moves on: a new Proxy appears.
	require.NoError(t, env.Client.Create(ctx, managed(ns, "during")))
	time.Sleep(8 * time.Second) // longer than the controller's lease (4s): it loses leadership
	// The broker keeps serving what it knew.
	lease := rest.Do(t, "POST", b+"/v1/leases", `{"namespace":"`+ns+`","ttlSeconds":60}`)
	assert.Equal(t, 200, lease.Status, "the broker leases from its last inventory while the API server is away: %s", lease.Body)
	for _, p := range s.Brokers {
		assert.False(t, p.Proc.Exited(), "broker survived")
	}
	for _, p := range s.Probers {
		assert.False(t, p.Exited(), "prober survived")
	}

	s.APILink.Restore(t)
	if s.Controllers[0].Proc.Exited() {
		// A controller that lost its lease exits by design and its pod
		// restarts; here the test is the restarter.
		s.StartController(0)
	}
	waitProxy(t, ns, "during", "healthy after the partition", healthy)
	require.Eventually(t, func() bool { return listed(t, b)[ns+"/during"] != "" }, 60*time.Second, 100*time.Millisecond, "the broker's inventory caught up")
	assert.True(t, waitProxy(t, ns, "before", "still healthy", healthy).Status.Healthy)
}
