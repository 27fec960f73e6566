package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"

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
		"--leader-election-namespace", "default", "--probe-addr", proc.Addr(proc.FreePort(t)), "--probe-insecure",
	}, fmt.Sprintf("http://%s/healthz", proc.Addr(health)), fmt.Sprintf("http://%s/metrics", proc.Addr(metrics)))
}

func TestBadFlagsExitNonZero(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	proc.BadFlag(t, "controller-unknown-flag", bin, []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag")
	proc.BadFlag(t, "controller-bad-duration", bin, []string{"--leader-election-lease-duration", "soon"}, "invalid value", "leader-election-lease-duration")
	proc.BadFlag(t, "controller-missing-kubeconfig", bin, []string{"--kubeconfig", "/nonexistent/kubeconfig", "--probe-insecure"}, "--kubeconfig", "/nonexistent/kubeconfig")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"qps", []string{"--kube-api-qps", "0"}, "--kube-api-qps must be positive"},
		{"burst", []string{"--kube-api-burst", "0"}, "--kube-api-burst at least 1"},
		{"reconciles", []string{"--max-concurrent-reconciles", "0"}, "--max-concurrent-reconciles"},
		{"writers", []string{"--health-write-workers", "-1"}, "--health-write-workers must be at least 1"},
		{"resync", []string{"--resync-qps", "-2"}, "--resync-qps must be positive (got -2)"},
		{"stale", []string{"--health-stale-intervals", "1"}, "--health-stale-intervals must be at least 2 (got 1)"},
		{"timeout", []string{"--health-timeout", "30s"}, "--health-timeout 30s must be less than --health-interval 30s"},
		{"no-tls", nil, "--probe-tls-cert-file and --probe-tls-key-file are required"},
		{"tls-and-insecure", []string{"--probe-insecure", "--probe-tls-cert-file", "x.pem", "--probe-tls-key-file", "x.key"}, "--probe-insecure contradicts"},
		{"tls-missing", []string{"--probe-tls-cert-file", "/nonexistent/tls.crt", "--probe-tls-key-file", "/nonexistent/tls.key"}, "/nonexistent/tls.crt"},
		{"deny", []string{"--probe-insecure", "--probe-deny-cidrs", "169.254.0.0/99"}, `--probe-deny-cidrs: "169.254.0.0/99" is not a CIDR`},
	} {
		proc.BadFlag(t, "controller-bad-"+tc.name, bin, tc.args, tc.want)
	}
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

func TestBadProvidersConfigFailsStartup(t *testing.T) {
	proc.RequireProcesses(t)
	bin := proc.Build(t, pkgPath)
	cases := map[string]struct{ yaml, want string }{
		"unknown type":   {"providers:\n- {name: x, type: azure}\n", `unknown type "azure"`},
		"duplicate name": {"providers:\n- {name: k, type: kubernetes}\n- {name: k, type: kubernetes}\n", `duplicate name "k"`},
		"missing type":   {"providers:\n- {name: k}\n", "type is required"},
		"stray block":    {"providers:\n- {name: k, type: kubernetes, gcp: {project: p}}\n", `unknown field "gcp"`},
		"bad block":      {"providers:\n- {name: k, type: kubernetes, kubernetes: {namespce: x}}\n", `unknown field "namespce"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := t.TempDir() + "/providers.yaml"
			require.NoError(t, os.WriteFile(path, []byte(tc.yaml), 0o600))
			kubeconfig := "/nonexistent"
			if env != nil {
				kc, err := env.WriteKubeconfig(t.TempDir())
				require.NoError(t, err)
				kubeconfig = kc
			}
			proc.BadFlag(t, "controller-config", bin, []string{"--providers-config", path, "--kubeconfig", kubeconfig,
				"--metrics-bind-address", "0", "--health-probe-bind-address", "0", "--probe-addr", "127.0.0.1:0", "--probe-insecure"}, "--providers-config", tc.want)
		})
	}
}

// The chart's pre-delete hook runs the binary with --uninstall: a Proxy
// whose instance is not deleted in time fails it, naming the Proxy, and
// once it is gone the hook succeeds.
func TestUninstallHook(t *testing.T) {
	testenv.Require(t)
	bin := proc.Build(t, pkgPath)
	kubeconfig, err := env.WriteKubeconfig(t.TempDir())
	require.NoError(t, err)
	ns := env.Namespace(t, "hook")
	px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "held", Finalizers: []string{"test.crawl.example.com/held"}},
		Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "kubernetes"}}
	require.NoError(t, env.Client.Create(t.Context(), px))
	run := func() (string, int) {
		cmd := exec.Command(bin, "--kubeconfig", kubeconfig, "--uninstall", "--uninstall-timeout", "1s")
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return string(out), exit.ExitCode()
		}
		require.NoError(t, err)
		return string(out), 0
	}
	out, code := run()
	assert.Equal(t, 1, code, out)
	assert.Contains(t, out, ns+"/held")
	assert.Contains(t, out, "uninstall again")

	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKeyFromObject(px), px))
	px.Finalizers = nil
	require.NoError(t, env.Client.Update(t.Context(), px))
	out, code = run()
	assert.Equal(t, 0, code, out)
	assert.Contains(t, out, "no Proxy is left")
}
