// Command demo runs the whole system on one machine, on loopback only, and
// walks the README's quickstart against it: a real API server and etcd, Redis,
// the controller, two probers and two brokers as real processes, an HTTPS
// probe target with its own CA, and a stand-in kubelet that runs a real
// Squid for each kubernetes-provider pod. `make demo` runs it.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

var start = time.Now()

func step(format string, args ...any) {
	fmt.Printf("[%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
}

// waitFor polls ok, printing progress every few seconds, and fails naming
// the process to look at.
func waitFor(r *system.Runner, what, lookAt string, limit time.Duration, ok func() (bool, string)) {
	deadline := time.Now().Add(limit)
	last := time.Now()
	for {
		done, state := ok()
		if done {
			return
		}
		if time.Now().After(deadline) {
			r.Fatalf("%s did not happen within %s (last: %s); look at the %s log", what, limit, state, lookAt)
		}
		if time.Since(last) > 3*time.Second {
			step("  still waiting: %s (%s)", what, state)
			last = time.Now()
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func main() {
	once := flag.Bool("once", false, "exit after the walk (for CI)")
	dir := flag.String("dir", ".demo", "working directory for logs, kubeconfig and data")
	flag.Parse()
	r := system.NewRunner(*dir)
	defer r.Stop()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	step("starting the API server and etcd (envtest binaries built from source)")
	env := r.StartAPIServer()
	// Two controller replicas, as the chart runs: one leads, probers find
	// it through a round-robin balancer, the probe stream over TLS.
	// The brokers want a token, as the chart's do by default, and serve the
	// proxy gateway, whose password it is.
	sys := system.Start(r, env, system.Options{Controllers: 2, Probers: 2, Brokers: 2, BrokerToken: demoToken, Gateway: true, GatewayToken: demoGatewayToken, Step: step})
	c := env.Client
	kubeconfig := sys.Kubeconfig
	for i, ctl := range sys.Controllers {
		r.Logf("controller-%d log: %s", i, ctl.Proc.LogPath)
	}
	var rest []string
	for i, b := range sys.Brokers {
		r.Logf("broker-%d log: %s (REST %s, gRPC %s)", i, b.Proc.LogPath, b.REST, b.GRPC)
		rest = append(rest, b.REST)
	}
	for i, p := range sys.Probers {
		r.Logf("prober-%d log: %s", i, p.LogPath)
	}

	step("a local Squid for the External proxy")
	ext := proc.StartSquid(r, "127.0.0.2", false)

	step("applying a Managed kubernetes Proxy and an External Proxy")
	for _, px := range []*v1.Proxy{
		{ObjectMeta: metav1.ObjectMeta{Name: "proxy-kubernetes-sample", Namespace: "default"},
			Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "kubernetes", Attributes: map[string]string{"geo": "local"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "proxy-external-sample", Namespace: "default"},
			Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: ext.Host, Port: int32(ext.Port), Attributes: map[string]string{"geo": "local"}}},
	} {
		if err := c.Create(ctx, px); err != nil {
			r.Fatalf("creating %s: %v", px.Name, err)
		}
	}
	for _, name := range []string{"proxy-kubernetes-sample", "proxy-external-sample"} {
		waitFor(r, name+" Ready and Healthy", "controller", 90*time.Second, func() (bool, string) {
			px := &v1.Proxy{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, px); err != nil {
				return false, err.Error()
			}
			h := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy)
			state := fmt.Sprintf("phase %s", px.Status.Phase)
			if h != nil {
				state += ", healthy " + string(h.Status) + " " + h.Message
			}
			return px.Status.Phase == v1.PhaseReady && px.Status.IsHealthy(), state
		})
		step("%s is Ready and Healthy", name)
	}
	waitFor(r, "brokers listing both proxies as healthy", "broker-0", 30*time.Second, func() (bool, string) {
		var out struct{ Proxies []any }
		resp := call(r, "GET", rest[0]+"/v1/proxies?healthy=true", "", false)
		_ = json.Unmarshal(resp.body, &out)
		return len(out.Proxies) == 2, fmt.Sprintf("%d listed", len(out.Proxies))
	})

	fmt.Println()
	step("the README's quickstart over REST (broker-0 unless noted)")
	call(r, "GET", rest[0]+"/v1/proxies?healthy=true", "", true)
	lease := call(r, "POST", rest[0]+"/v1/leases", `{"selector":{"geo":"local"},"ttlSeconds":300}`, true)
	var l struct {
		LeaseID string `json:"leaseID"`
	}
	_ = json.Unmarshal(lease.body, &l)
	if lease.status != 200 || l.LeaseID == "" {
		r.Fatalf("lease failed: %d %s; look at the broker-0 log", lease.status, lease.body)
	}
	call(r, "POST", rest[1]+"/v1/leases/"+l.LeaseID+"/report", `{"result":"rate_limited","target":"example.com"}`, true)
	for i := range 2 {
		resp := call(r, "DELETE", rest[i]+"/v1/leases/"+l.LeaseID, "", true)
		if resp.status != http.StatusNoContent {
			r.Fatalf("release #%d answered %d, want 204", i+1, resp.status)
		}
	}

	fmt.Println()
	step("the gateway: any HTTP client, no code (a CONNECT tunnel leases a proxy for its target)")
	gatewayLine := gatewayWalk(r, sys)

	fmt.Println()
	step("kubectl get px -o wide")
	printProxies(ctx, c)

	fmt.Println()
	poolWalk(ctx, r, c)

	fmt.Println()
	fmt.Printf("Everything runs on loopback. kubeconfig: %s\n", kubeconfig)
	fmt.Printf("REST: %s and %s   (try: curl -s -H 'Authorization: Bearer %s' '%s/v1/proxies?healthy=true')\n", rest[0], rest[1], demoToken, rest[0])
	fmt.Printf("Gateway: %s and %s   (try: %s)\n", sys.Brokers[0].Gateway, sys.Brokers[1].Gateway, gatewayLine)
	fmt.Printf("Console: %s/console/   (token: %s)\n", rest[0], demoToken)
	fmt.Printf("Logs: %s\n", filepath.Join(r.Dir, "tmp"))
	if *once {
		step("--once: stopping everything")
		return
	}
	fmt.Println("Ctrl-C stops everything.")
	<-ctx.Done()
	step("stopping everything")
}

// demoToken is the brokers' bearer token; demoGatewayToken the gateway's
// password, which opens tunnels and nothing else (the chart's
// auth.gatewayToken).
const (
	demoToken        = "demo-token"
	demoGatewayToken = "demo-gateway-token"
)

// gatewayWalk fetches the probe target's /ip through broker 0's gateway,
// as the curl line it prints does, and returns that line.
func gatewayWalk(r *system.Runner, sys *system.System) string {
	gw := sys.Brokers[0].Gateway
	proxy := &url.URL{Scheme: "http", User: url.UserPassword("attr.geo=local", demoGatewayToken), Host: gw}
	line := fmt.Sprintf("curl -s --cacert %s -x '%s' %s/ip", sys.Target.CAFile, proxy, sys.Target.URL)
	fmt.Printf("\n$ %s\n", line)
	pool, err := certs.LoadPool(sys.Target.CAFile)
	if err != nil {
		r.Fatalf("%v", err)
	}
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: pool}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(sys.Target.URL + "/ip")
	if err != nil {
		r.Fatalf("through the gateway: %v; look at the broker-0 log", err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		r.Fatalf("through the gateway: %s %s; look at the broker-0 log", resp.Status, b)
	}
	fmt.Printf("%s   (the target saw the leased proxy's address)\n", strings.TrimSpace(string(b)))
	return line
}

type answer struct {
	status int
	body   []byte
}

func call(r *system.Runner, method, url, body string, show bool) answer {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Authorization", "Bearer "+demoToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.Fatalf("%s %s: %v; look at the broker logs", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, _ := io.ReadAll(resp.Body)
	if show {
		fmt.Printf("\n$ curl -s -H 'Authorization: Bearer %s' -X%s '%s'", demoToken, method, url)
		if body != "" {
			fmt.Printf(" -d '%s'", body)
		}
		fmt.Printf("\n%s %s\n", resp.Proto, resp.Status)
		var pretty bytes.Buffer
		if json.Indent(&pretty, b, "", "  ") == nil {
			fmt.Println(pretty.String())
		} else if len(b) > 0 {
			fmt.Println(string(b))
		}
	}
	return answer{resp.StatusCode, b}
}

func printProxies(ctx context.Context, c client.Client, opts ...client.ListOption) {
	list := &v1.ProxyList{}
	if err := c.List(ctx, list, opts...); err != nil {
		fmt.Println(err)
		return
	}
	sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 3, ' ', 0)
	_, _ = fmt.Fprintln(w, "NAME\tMODE\tPROVIDER\tPHASE\tIP\tPORT\tHEALTHY\tEGRESS IP\tAGE")
	for _, px := range list.Items {
		h := "Unknown"
		if c := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy); c != nil {
			h = string(c.Status)
		}
		_, _ = fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", px.Name, px.Spec.Mode, px.Spec.Provider, px.Status.Phase, px.Status.IP, px.Spec.Port, h,
			px.Status.EgressIP, time.Since(px.CreationTimestamp.Time).Round(time.Second))
	}
	_ = w.Flush()
}

// poolWalk creates a ProxyPool of 3, scales it to 5 and back to 2 through
// /scale, and rolls a template change, printing the pool and its members
// along the way.
func poolWalk(ctx context.Context, r *system.Runner, c client.Client) {
	step("applying a ProxyPool of 3 (deploy/samples/proxypool.yaml, smaller)")
	pool := &v1.ProxyPool{
		ObjectMeta: metav1.ObjectMeta{Name: "demo-pool", Namespace: "default"},
		Spec: v1.ProxyPoolSpec{
			Replicas: ptr.To[int32](3),
			Template: v1.ProxyTemplate{Spec: v1.ProxyTemplateSpec{Provider: "kubernetes", Attributes: map[string]string{"pool": "demo"}}},
			// Two members may drain at once, so the walk is quick.
			Disruption: &v1.Disruption{MaxUnavailable: ptr.To(intstr.FromInt32(2))},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		r.Fatalf("creating the pool: %v", err)
	}
	settle := func(what string, n int32, port int32) {
		waitFor(r, what, "controller", 120*time.Second, func() (bool, string) {
			p := &v1.ProxyPool{}
			if err := c.Get(ctx, client.ObjectKeyFromObject(pool), p); err != nil {
				return false, err.Error()
			}
			st := p.Status
			members := &v1.ProxyList{}
			if err := c.List(ctx, members, client.InNamespace("default"), client.MatchingLabels{v1.LabelPool: pool.Name}); err != nil {
				return false, err.Error()
			}
			onPort := 0
			for _, m := range members.Items {
				if m.Spec.Port == port {
					onPort++
				}
			}
			state := fmt.Sprintf("%d members, %d healthy, %d up to date, %d draining", len(members.Items), st.HealthyReplicas, st.UpdatedReplicas, st.DrainingReplicas)
			return st.ObservedGeneration == p.Generation && meta.IsStatusConditionTrue(st.Conditions, v1.ConditionReady) &&
				st.HealthyReplicas == n && len(members.Items) == int(n) && onPort == int(n), state
		})
		step("%s", what)
		fmt.Println()
		step("kubectl get ppool")
		printPools(ctx, c)
		step("kubectl get px -l %s=%s", v1.LabelPool, pool.Name)
		printProxies(ctx, c, client.MatchingLabels{v1.LabelPool: pool.Name})
		fmt.Println()
	}
	settle("3 members Ready and Healthy", 3, 3128)
	for _, n := range []int32{5, 2} {
		step("kubectl scale ppool demo-pool --replicas=%d", n)
		scale := &autoscalingv1.Scale{}
		if err := c.SubResource("scale").Get(ctx, pool, scale); err != nil {
			r.Fatalf("reading /scale: %v", err)
		}
		scale.Spec.Replicas = n
		if err := c.SubResource("scale").Update(ctx, pool, client.WithSubResourceBody(scale)); err != nil {
			r.Fatalf("scaling: %v", err)
		}
		what := fmt.Sprintf("scaled to %d", n)
		if n < 5 {
			what += " (members left through a drain: no new leases, then deleted once they held none)"
		}
		settle(what, n, 3128)
	}
	step("a template change (port 3128 to 3129) rolls through the pool, make-before-break")
	if err := c.Patch(ctx, pool, client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"port":3129}}}}`))); err != nil {
		r.Fatalf("changing the template: %v", err)
	}
	settle("rolled: every member made from the new template", 2, 3129)
}

func printPools(ctx context.Context, c client.Client) {
	list := &v1.ProxyPoolList{}
	if err := c.List(ctx, list); err != nil {
		fmt.Println(err)
		return
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 3, ' ', 0)
	_, _ = fmt.Fprintln(w, "NAME\tDESIRED\tREADY\tHEALTHY\tLEASED\tUP-TO-DATE\tAGE")
	for _, p := range list.Items {
		_, _ = fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Name, ptr.Deref(p.Spec.Replicas, 1), p.Status.ReadyReplicas, p.Status.HealthyReplicas,
			p.Status.LeasedReplicas, p.Status.UpdatedReplicas, time.Since(p.CreationTimestamp.Time).Round(time.Second))
	}
	_ = w.Flush()
}
