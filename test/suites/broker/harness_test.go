package broker

import (
	"os"
	"testing"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/test/framework"
)

const pkgPath = framework.BrokerPackage

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

// broker is one broker process (framework.Broker).
type broker = framework.Broker

func startBroker(t *testing.T, f *fleet, r *proc.Redis, extra ...string) *broker {
	t.Helper()
	return framework.StartBroker(t, env, f.ns, r, extra...)
}
