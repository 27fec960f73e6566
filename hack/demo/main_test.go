package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// The README's run command stays true: the demo comes up, walks the
// quickstart and exits 0 with --once.
func TestDemoOnce(t *testing.T) {
	testenv.Require(t)
	if testenv.AssetsDir() == "" {
		t.Fatal("envtest binaries missing: run make envtest")
	}
	bin := proc.Build(t, "github.com/egress-proxies/egress-proxies/hack/demo")
	p := proc.StartEnv(t, "demo", []string{"KUBEBUILDER_ASSETS=" + testenv.AssetsDir()}, bin, "--once", "--dir", t.TempDir())
	code, err := p.Wait(5 * time.Minute)
	require.NoError(t, err)
	out := p.Log()
	require.Equal(t, 0, code, out)
	assert.Equal(t, 2, strings.Count(out, "204 No Content"), "release answered 204 twice")
	assert.Contains(t, out, `"leaseID"`)
	assert.Contains(t, out, `"cooldownUntil"`)
	assert.Regexp(t, `proxy-kubernetes-sample\s+Managed\s+kubernetes\s+Ready\s+127\.\d+\.\d+\.\d+\s+3128\s+True`, out)
	assert.Regexp(t, `proxy-external-sample\s+External\s+Ready\s+127\.0\.0\.2\s+\d+\s+True`, out)
	// The ProxyPool walk: 3, 5, 2, then rolled to port 3129.
	for _, n := range []string{"3", "5", "2"} {
		assert.Regexp(t, `demo-pool\s+`+n+`\s+`+n+`\s+`+n+`\s+0\s+`+n+`\s`, out, "kubectl get ppool at %s", n)
	}
	assert.Contains(t, out, "rolled: every member made from the new template")
	assert.Regexp(t, `Console: http://127\.0\.0\.1:\d+/console/`, out, "the demo prints the console's address")
	assert.Regexp(t, `demo-pool-\d+\s+Managed\s+kubernetes\s+Ready\s+127\.\d+\.\d+\.\d+\s+3129\s+True`, out)
}
