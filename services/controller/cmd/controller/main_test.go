package main

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

const pkgPath = "github.com/egress-proxies/egress-proxies/services/controller/cmd/controller"

var env *testenv.Env

func TestMain(m *testing.M) { os.Exit(testenv.Main(m, &env)) }

func TestBinaryLifecycle(t *testing.T) {
	testenv.Require(t)
	bin := proc.Build(t, pkgPath)
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	metrics, health := proc.FreePort(t), proc.FreePort(t)
	proc.Lifecycle(t, "controller", bin, nil, []string{
		"--kubeconfig", kubeconfig,
		"--metrics-bind-address", proc.Addr(metrics),
		"--health-probe-bind-address", proc.Addr(health),
		"--leader-election-namespace", "default",
	}, fmt.Sprintf("http://%s/healthz", proc.Addr(health)), fmt.Sprintf("http://%s/metrics", proc.Addr(metrics)))
}

func TestBadFlagsExitNonZero(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	proc.BadFlag(t, "controller-unknown-flag", bin, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag")
	proc.BadFlag(t, "controller-bad-duration", bin, []string{"--leader-election-lease-duration", "soon"}, "invalid value", "leader-election-lease-duration")
	proc.BadFlag(t, "controller-missing-kubeconfig", bin, []string{"--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig", "/nonexistent/kubeconfig")
}

func TestEnvFallbackIsValidated(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	p := proc.StartEnv(t, "controller-bad-env", []string{"CONTROLLER_LEADER_ELECT=maybe"}, bin)
	code, err := p.Wait(30e9)
	require.NoError(t, err)
	require.Equal(t, 2, code)
	require.Contains(t, p.Log(), "CONTROLLER_LEADER_ELECT")
}
