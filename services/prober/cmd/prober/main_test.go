package main

import (
	"fmt"
	"testing"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

const pkgPath = "github.com/egress-proxies/egress-proxies/services/prober/cmd/prober"

func TestBinaryLifecycle(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	ops := proc.FreePort(t)
	proc.Lifecycle(t, "prober", bin, nil, []string{"--ops-addr", proc.Addr(ops)},
		fmt.Sprintf("http://%s/healthz", proc.Addr(ops)), fmt.Sprintf("http://%s/metrics", proc.Addr(ops)))
}

func TestBadFlagsExitNonZero(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	proc.BadFlag(t, "prober-unknown-flag", bin, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag")
	proc.BadFlag(t, "prober-bad-level", bin, []string{"--log-level", "loud"}, "--log-level", "want debug, info, warn or error")
	proc.BadFlag(t, "prober-stray-arg", bin, []string{"stray"}, `unexpected argument "stray"`)
}
