package main

import (
	"fmt"
	"testing"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

const pkgPath = "github.com/egress-proxies/egress-proxies/services/prober/cmd/prober"

// The prober starts and serves its ops endpoint even while no controller
// answers (it keeps reconnecting), and exits 0 on SIGTERM.
func TestBinaryLifecycle(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	ops := proc.FreePort(t)
	proc.Lifecycle(t, "prober", bin, nil, []string{"--ops-addr", proc.Addr(ops), "--controller-addr", proc.Addr(proc.FreePort(t)), "--controller-insecure"},
		fmt.Sprintf("http://%s/healthz", proc.Addr(ops)), fmt.Sprintf("http://%s/metrics", proc.Addr(ops)))
}

func TestBadFlagsExitNonZero(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	proc.BadFlag(t, "prober-unknown-flag", bin, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag")
	proc.BadFlag(t, "prober-bad-level", bin, []string{"--log-level", "loud"}, "--log-level", "want debug, info, warn or error")
	proc.BadFlag(t, "prober-stray-arg", bin, []string{"stray"}, `unexpected argument "stray"`)
	proc.BadFlag(t, "prober-no-controller", bin, nil, "--controller-addr is required")
	proc.BadFlag(t, "prober-bad-ca", bin, []string{"--controller-addr", "127.0.0.1:1", "--controller-insecure", "--ca-file", "/nonexistent/ca.pem"}, "--ca-file", "/nonexistent/ca.pem")
	proc.BadFlag(t, "prober-no-tls", bin, []string{"--controller-addr", "127.0.0.1:1"}, "--controller-ca-file is required")
	proc.BadFlag(t, "prober-bad-controller-ca", bin, []string{"--controller-addr", "127.0.0.1:1", "--controller-ca-file", "/nonexistent/ca.crt"}, "--controller-ca-file", "/nonexistent/ca.crt")
	proc.BadFlag(t, "prober-tls-and-insecure", bin, []string{"--controller-addr", "127.0.0.1:1", "--controller-insecure", "--controller-ca-file", "x"}, "--controller-insecure contradicts")
	proc.BadFlag(t, "prober-bad-deny", bin, []string{"--controller-addr", "127.0.0.1:1", "--controller-insecure", "--deny-cidrs", "nope"}, `--deny-cidrs: "nope" is not a CIDR`)
}
