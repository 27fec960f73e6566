package broker

import (
	"testing"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

func TestBinaryLifecycle(t *testing.T) {
	f := newFleet(t)
	r := proc.StartRedis(t, false)
	b := startBroker(t, f, r)
	b.P.Kill() // the harness already proved readiness; run the lifecycle check on a fresh one
	ops := proc.FreePort(t)
	proc.Lifecycle(t, "broker-lifecycle", proc.Build(t, pkgPath), nil,
		append([]string{"--ops-addr", proc.Addr(ops), "--grpc-addr", proc.Addr(proc.FreePort(t)), "--http-addr", proc.Addr(proc.FreePort(t))}, b.Args...),
		"http://"+proc.Addr(ops)+"/healthz", "http://"+proc.Addr(ops)+"/metrics")
}

func TestBadFlagsExitNonZero(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	proc.BadFlag(t, "broker-unknown-flag", bin, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag")
	proc.BadFlag(t, "broker-bad-level", bin, []string{"--log-level", "loud"}, "--log-level", "want debug, info, warn or error")
	proc.BadFlag(t, "broker-stray-arg", bin, []string{"stray"}, `unexpected argument "stray"`)
	proc.BadFlag(t, "broker-bad-ttl", bin, []string{"--default-ttl", "2h"}, "--default-ttl 2h0m0s must be between")
	proc.BadFlag(t, "broker-open-gateway", bin, []string{"--gateway-addr", "127.0.0.1:0"}, "--gateway-addr needs --token-file or --tenant-namespace: without credentials the gateway would be an open proxy")
	proc.BadFlag(t, "broker-long-gateway-leases", bin, []string{"--gateway-addr", "127.0.0.1:0", "--token-file", "/dev/null", "--gateway-lease-ttl", "2h"}, "--gateway-lease-ttl 2h0m0s must be between --min-ttl 10s and --max-ttl 1h0m0s")
	proc.BadFlag(t, "broker-bad-egress", bin, []string{"--egress-deny-cidrs", "10.0.0.0/33"}, "--egress-deny-cidrs", "is not a CIDR")
	proc.BadFlag(t, "broker-bad-token", bin, []string{"--token-file", "/nonexistent/token", "--kubeconfig", "/dev/null"}, "--token-file", "/nonexistent/token")
}
