package proc

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/squidconf"
)

// Squid is a real Squid on a loopback address with a generated config.
type Squid struct {
	Addr string
	Host string
	Port int
	Dir  string
	// AccessLog is the file Squid logs each request to (squid's native
	// format: time, elapsed, client, code/status, bytes, method, URL, user,
	// hierarchy/peer, type).
	AccessLog string
	// DenyAll makes Squid refuse every request (403): a proxy that accepts
	// connections but cannot egress.
	DenyAll bool
	Proc    *Process
	t       T
}

// SquidBinary finds squid or fails saying how to get it.
func SquidBinary(t T) string {
	t.Helper()
	for _, p := range []string{"squid", "/usr/sbin/squid"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatalf("squid not found: run `make deps` (apt-get install squid)")
	return ""
}

// StartSquid starts Squid on host (a 127.0.0.0/8 address) and a free port.
func StartSquid(t T, host string, denyAll bool) *Squid {
	t.Helper()
	return StartSquidAt(t, host, 0, denyAll)
}

// StartSquidAt starts Squid on host:port (0: a free one): an open proxy
// (no credentials, no egress policy), or with denyAll one whose policy
// denies every destination.
func StartSquidAt(t T, host string, port int, denyAll bool) *Squid {
	t.Helper()
	var egress netpolicy.Egress
	if denyAll {
		egress.Deny = netpolicy.DenyList{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	}
	s := startSquid(t, host, port, func(c *squidconf.Config) { c.Egress = egress })
	s.DenyAll = denyAll
	return s
}

// StartSquidWithAuth starts Squid on host and a free port, asking every
// client for Basic proxy credentials (407 without them) and admitting
// only user with password, with the config the kubernetes provider's pods
// run (squidconf) and the suites' egress policy (SuiteEgress): a bought
// proxy, or a Managed one that is not an open proxy.
func StartSquidWithAuth(t T, host, user, password string) *Squid {
	t.Helper()
	return StartSquidWithAuthAt(t, host, 0, user, password)
}

// StartSquidWithAuthAt is StartSquidWithAuth on host:port (0: a free one).
func StartSquidWithAuthAt(t T, host string, port int, user, password string) *Squid {
	t.Helper()
	return StartSquidWithEgress(t, host, port, proxyauth.Credentials{Username: user, Password: password}, SuiteEgress())
}

// SuiteAllowance is the suites' egress allowance (--egress-allowance-cidrs):
// loopback, where their targets listen.
const SuiteAllowance = "127.0.0.0/8"

// SuiteEgress is the default egress policy with the suites' allowance.
func SuiteEgress() netpolicy.Egress {
	e := netpolicy.DefaultEgress()
	e.Allowance = netpolicy.DenyList{netip.MustParsePrefix(SuiteAllowance)}
	return e
}

// StartSquidWithEgress starts Squid on host:port (0: a free one) with
// squidconf's config: creds asked for, egress enforced.
func StartSquidWithEgress(t T, host string, port int, creds proxyauth.Credentials, egress netpolicy.Egress) *Squid {
	t.Helper()
	return startSquid(t, host, port, func(c *squidconf.Config) {
		helper := filepath.Join(c.Dir, "auth.sh")
		if err := os.WriteFile(helper, []byte(creds.SquidHelper()), 0o755); err != nil {
			t.Fatal(err)
		}
		c.AuthHelper, c.Egress = helper, egress
	})
}

// startSquid starts Squid with squidconf's config, which conf completes.
// Every suite Squid egresses from the address it listens on and logs each
// request to AccessLog.
func startSquid(t T, host string, port int, conf func(*squidconf.Config)) *Squid {
	t.Helper()
	if tb, ok := t.(testing.TB); ok {
		RequireProcesses(tb)
	}
	s := newSquid(t, host)
	pick := func() int { return port }
	if port == 0 {
		pick = func() int { return FreePort(t) }
	}
	startListening(t, pick, func(port int) error {
		s.configure(port, conf)
		return s.start()
	})
	return s
}

// newSquid is a Squid on host with its directory made, not yet configured.
func newSquid(t T, host string) *Squid {
	t.Helper()
	// Squid drops privileges to its own user when started as root, so its
	// directory must sit where that user can reach it: not under the test's
	// private temp dir.
	dir, err := os.MkdirTemp("", "egress-proxies-squid-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return &Squid{Host: host, Dir: dir, AccessLog: filepath.Join(dir, "access.log"), t: t}
}

// configure writes the config for port, which conf completes.
func (s *Squid) configure(port int, conf func(*squidconf.Config)) {
	s.Port, s.Addr = port, net.JoinHostPort(s.Host, strconv.Itoa(port))
	c := squidconf.Config{Listen: s.Addr, Dir: s.Dir, AccessLog: s.AccessLog, OutgoingAddress: s.Host, ConnectTimeout: 5 * time.Second}
	conf(&c)
	if err := os.WriteFile(filepath.Join(s.Dir, "squid.conf"), []byte(c.String()), 0o644); err != nil {
		s.t.Fatal(err)
	}
}

// Start (re)starts Squid with the same config, address and port.
func (s *Squid) Start() {
	s.t.Helper()
	startListening(s.t, func() int { return s.Port }, func(int) error { return s.start() })
}

// start runs Squid and waits until it listens; Squid says why it did not
// in its cache log, not on stderr.
func (s *Squid) start() error {
	cacheLog := filepath.Join(s.Dir, "cache.log")
	_ = os.Remove(filepath.Join(s.Dir, "squid.pid"))
	_ = os.Remove(cacheLog)
	s.Proc = Start(s.t, "squid-"+s.Addr, SquidBinary(s.t), "-N", "-f", filepath.Join(s.Dir, "squid.conf"))
	return waitListening(s.Proc, s.Addr, 20*time.Second, func() string {
		b, _ := os.ReadFile(cacheLog)
		return string(b)
	})
}

// Kill stops Squid with SIGKILL.
func (s *Squid) Kill() { s.Proc.Kill() }

// Logged waits up to 5 s for Squid's access log to hold every one of
// lines (substrings) and returns the log. Squid writes a request's line
// when its transaction ends, and the readiness check's bare connection
// writes one too, so a test waits for the lines it asserts, never for a
// count of lines.
func (s *Squid) Logged(lines ...string) string {
	s.t.Helper()
	var log string
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(s.AccessLog)
		log = string(b)
		missing := ""
		for _, l := range lines {
			if !strings.Contains(log, l) {
				missing = l
				break
			}
		}
		if missing == "" {
			return log
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("squid %s never logged %q; its access log:\n%s", s.Addr, missing, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
