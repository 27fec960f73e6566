package framework

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/rest"
)

// BrokerPackage is the broker's main package, built once per test binary.
const BrokerPackage = "github.com/egress-proxies/egress-proxies/services/broker/cmd/broker"

// Broker is one broker process on loopback ports of its own, reading the
// Proxies of a namespace of the API server and keeping its state in a
// real Redis.
type Broker struct {
	t *testing.T
	P *proc.Process
	// REST and Ops are URLs, GRPC an address.
	REST, GRPC, Ops string
	// Args are its flags, ports aside: a restart starts it with them again.
	Args []string
	// Env is added to its environment.
	Env []string
}

// NewBroker is a broker to serve namespace of env's API server (""
// every namespace), on Redis r, with extra flags; Start starts it.
func NewBroker(t *testing.T, env *testenv.Env, namespace string, r *proc.Redis, extra ...string) *Broker {
	t.Helper()
	kc, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	args := []string{"--kubeconfig", kc, "--redis-addrs", r.Addr}
	if namespace != "" {
		args = append(args, "--namespace", namespace)
	}
	return &Broker{t: t, Args: append(args, extra...)}
}

// StartBroker is NewBroker, started and ready.
func StartBroker(t *testing.T, env *testenv.Env, namespace string, r *proc.Redis, extra ...string) *Broker {
	t.Helper()
	b := NewBroker(t, env, namespace, r, extra...)
	b.Start()
	return b
}

// Start starts the process on new ports and waits until it is ready.
func (b *Broker) Start() {
	b.t.Helper()
	ops, g, h := proc.FreePort(b.t), proc.FreePort(b.t), proc.FreePort(b.t)
	b.REST, b.GRPC, b.Ops = "http://"+proc.Addr(h), proc.Addr(g), "http://"+proc.Addr(ops)
	args := append([]string{"--ops-addr", proc.Addr(ops), "--grpc-addr", proc.Addr(g), "--http-addr", proc.Addr(h)}, b.Args...)
	b.P = proc.StartEnv(b.t, "broker", b.Env, proc.Build(b.t, BrokerPackage), args...)
	proc.WaitHTTP(b.t, b.P, b.Ops+"/readyz", 60*time.Second)
}

// Restart kills the process with SIGKILL and starts a new one on new
// ports.
func (b *Broker) Restart() {
	b.P.Kill()
	b.Start()
}

// Do makes a REST call.
func (b *Broker) Do(method, path, body string, header ...string) rest.Reply {
	b.t.Helper()
	return rest.Do(b.t, method, b.REST+path, body, header...)
}

// Lease is a CreateLease over REST.
func (b *Broker) Lease(body string) rest.Reply { return b.Do("POST", "/v1/leases", body) }

// LeaseFor is a CreateLease that must succeed: its lease's id and its
// proxy's.
func (b *Broker) LeaseFor(body string) (id, proxy string) {
	b.t.Helper()
	r := b.Lease(body)
	require.Equal(b.t, 200, r.Status, "%s: %s", body, r.Body)
	return r.JSON["leaseID"].(string), r.JSON["proxy"].(map[string]any)["id"].(string)
}

// Report is a ReportLease that must succeed.
func (b *Broker) Report(id, body string) rest.Reply {
	b.t.Helper()
	r := b.Do("POST", "/v1/leases/"+id+"/report", body)
	require.Equal(b.t, 200, r.Status, "%s: %s", body, r.Body)
	return r
}

// WaitListed waits until the broker's inventory lists n proxies.
func (b *Broker) WaitListed(n int) {
	b.t.Helper()
	require.Eventually(b.t, func() bool {
		r := b.Do("GET", "/v1/proxies", "")
		ps, _ := r.JSON["proxies"].([]any)
		return r.Status == 200 && len(ps) == n
	}, 30*time.Second, 50*time.Millisecond, "the broker never listed %d proxies", n)
}

// GatewayAddr is the --gateway-addr the broker was started with.
func (b *Broker) GatewayAddr() string {
	for i, a := range b.Args {
		if a == "--gateway-addr" {
			return b.Args[i+1]
		}
	}
	b.t.Fatal("no --gateway-addr")
	return ""
}

// Counts maps each proxy's id to its leaseCount, as ListProxies says.
func (b *Broker) Counts() map[string]int {
	b.t.Helper()
	r := b.Do("GET", "/v1/proxies", "")
	require.Equal(b.t, 200, r.Status, string(r.Body))
	out := map[string]int{}
	for _, p := range r.JSON["proxies"].([]any) {
		m := p.(map[string]any)
		out[m["id"].(string)] = int(m["leaseCount"].(float64))
	}
	return out
}

// Metrics scrapes the broker's /metrics.
func (b *Broker) Metrics() promtext.Samples {
	b.t.Helper()
	m, err := promtext.Scrape(nil, b.Ops+"/metrics")
	require.NoError(b.t, err)
	return m
}
