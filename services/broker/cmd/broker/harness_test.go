package main

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

const pkgPath = "github.com/egress-proxies/egress-proxies/services/broker/cmd/broker"

var env *testenv.Env

func TestMain(m *testing.M) {
	// The gateway bench runs this binary again as its sink (one process
	// holds at most 20,000 descriptors here) and its baseline relay.
	if role := os.Getenv(helperEnv); role != "" {
		os.Exit(runHelper(role))
	}
	os.Exit(testenv.Main(m, &env))
}

// fleet is a namespace of Proxy objects whose status the test writes, as
// the controller would.
type fleet struct {
	t  testing.TB
	ns string
}

func newFleet(t *testing.T) *fleet {
	testenv.Require(t)
	return &fleet{t: t, ns: env.Namespace(t, "br")}
}

// add creates a Ready, healthy External proxy with attributes.
func (f *fleet) add(name, ip string, attrs map[string]string) {
	f.t.Helper()
	env.ReadyProxy(f.t, f.ns, name, ip, 3128, attrs, true)
}

// broker is one broker process.
type broker struct {
	t                  *testing.T
	p                  *proc.Process
	rest, grpc, opsURL string
	args               []string
}

func startBroker(t *testing.T, f *fleet, r *proc.Redis, extra ...string) *broker {
	t.Helper()
	kc, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	b := &broker{t: t}
	b.args = append([]string{"--kubeconfig", kc, "--namespace", f.ns, "--redis-addrs", r.Addr}, extra...)
	b.start()
	return b
}

func (b *broker) start() {
	b.t.Helper()
	ops, g, h := proc.FreePort(b.t), proc.FreePort(b.t), proc.FreePort(b.t)
	b.rest, b.grpc, b.opsURL = "http://"+proc.Addr(h), proc.Addr(g), "http://"+proc.Addr(ops)
	args := append([]string{"--ops-addr", proc.Addr(ops), "--grpc-addr", proc.Addr(g), "--http-addr", proc.Addr(h)}, b.args...)
	b.p = proc.Start(b.t, "broker", proc.Build(b.t, pkgPath), args...)
	proc.WaitHTTP(b.t, b.p, b.opsURL+"/readyz", 60*time.Second)
}

// restart kills the process with SIGKILL and starts a new one on new ports.
func (b *broker) restart() {
	b.p.Kill()
	b.start()
}

func (b *broker) do(method, path, body string, header ...string) rest.Reply {
	b.t.Helper()
	return rest.Do(b.t, method, b.rest+path, body, header...)
}

// waitListed waits until the broker's inventory shows n proxies.
func (b *broker) waitListed(n int) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		r := b.do("GET", "/v1/proxies", "")
		ps, _ := r.JSON["proxies"].([]any)
		return r.Status == 200 && len(ps) == n
	}, 30*time.Second, 50*time.Millisecond, "the broker never listed %d proxies", n)
}

// gatewayAddr is the --gateway-addr the broker was started with.
func (b *broker) gatewayAddr() string {
	for i, a := range b.args {
		if a == "--gateway-addr" {
			return b.args[i+1]
		}
	}
	b.t.Fatal("no --gateway-addr")
	return ""
}

func (b *broker) lease(body string) rest.Reply { return b.do("POST", "/v1/leases", body) }

// counts maps proxy id to leaseCount from the list endpoint.
func (b *broker) counts() map[string]int {
	b.t.Helper()
	r := b.do("GET", "/v1/proxies", "")
	require.Equal(b.t, 200, r.Status, string(r.Body))
	out := map[string]int{}
	for _, p := range r.JSON["proxies"].([]any) {
		m := p.(map[string]any)
		out[m["id"].(string)] = int(m["leaseCount"].(float64))
	}
	return out
}

// metrics scrapes the broker's /metrics.
func (b *broker) metrics() promtext.Samples {
	b.t.Helper()
	m, err := promtext.Scrape(nil, b.opsURL+"/metrics")
	require.NoError(b.t, err)
	return m
}
