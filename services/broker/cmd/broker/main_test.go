package main

import (
	"fmt"
	"testing"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

const pkgPath = "github.com/egress-proxies/egress-proxies/services/broker/cmd/broker"

func TestBinaryLifecycle(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	ops := proc.FreePort(t)
	proc.Lifecycle(t, "broker", bin, nil, []string{"--ops-addr", proc.Addr(ops)},
		fmt.Sprintf("http://%s/healthz", proc.Addr(ops)), fmt.Sprintf("http://%s/metrics", proc.Addr(ops)))
}

func TestBadFlagsExitNonZero(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	proc.BadFlag(t, "broker-unknown-flag", bin, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag")
	proc.BadFlag(t, "broker-bad-level", bin, []string{"--log-level", "loud"}, "--log-level", "want debug, info, warn or error")
	proc.BadFlag(t, "broker-stray-arg", bin, []string{"stray"}, `unexpected argument "stray"`)
}
