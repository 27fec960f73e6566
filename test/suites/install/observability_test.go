package install

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// series matches the names of series an expression reads.
var series = regexp.MustCompile(`\b((?:proxy_operator|grpc_server|leader_election)_[a-z_]+)`)

// exported are the series names the services can expose: every
// proxy_operator_* name in their Go source (histograms with their
// suffixes), go-grpc-middleware's grpc_server_* as the services build
// them, and controller-runtime's leader-election gauge.
func exported(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	add := func(n string, histogram bool) {
		names[n] = true
		if histogram {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[n+s] = true
			}
		}
	}
	lit := regexp.MustCompile(`"(proxy_operator_[a-z_]+)"`)
	for _, dir := range []string{"services", "pkg"} {
		require.NoError(t, filepath.WalkDir(filepath.Join(testenv.RepoRoot(), dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			b, err := os.ReadFile(p)
			for _, m := range lit.FindAllStringSubmatch(string(b), -1) {
				add(m[1], strings.HasSuffix(m[1], "_seconds"))
			}
			return err
		}))
	}
	descs := make(chan *prometheus.Desc, 16)
	service.NewGRPCMetrics().Describe(descs)
	close(descs)
	fq := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	for d := range descs {
		n := fq.FindStringSubmatch(d.String())[1]
		add(n, strings.HasSuffix(n, "_seconds"))
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/controller-runtime").Output()
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "pkg", "metrics", "leaderelection.go"))
	require.NoError(t, err)
	require.Contains(t, string(src), `"leader_election_master_status"`)
	add("leader_election_master_status", false)
	return names
}

// The alerts and the dashboard read only series the services export: a
// renamed metric breaks this test, not someone's pager.
func TestAlertsAndDashboardReadExportedSeries(t *testing.T) {
	testenv.Require(t)
	names := exported(t)
	objs := render(t, "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true", "--set", "serviceMonitor.enabled=true",
		"--set", "serviceMonitor.labels.release=kps")
	var exprs []string
	rule := find(t, objs, "PrometheusRule", "ep")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	var alerts []string
	for _, g := range groups {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			r := r.(map[string]any)
			alerts = append(alerts, r["alert"].(string))
			exprs = append(exprs, r["expr"].(string))
			assert.Contains(t, r["annotations"], "description", r["alert"])
			runbook, _ := r["annotations"].(map[string]any)["runbook_url"].(string)
			assert.True(t, strings.HasSuffix(runbook, "docs/operations.md#"+strings.ToLower(r["alert"].(string))), "%s's runbook_url %q", r["alert"], runbook)
		}
	}
	// Each alert's runbook is in docs/operations.md: what it means, the
	// first kubectl egress command, the fix.
	ops, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "operations.md"))
	require.NoError(t, err)
	for _, a := range alerts {
		_, section, ok := strings.Cut(string(ops), "\n### "+a+"\n")
		if !assert.True(t, ok, "docs/operations.md has no runbook for %s", a) {
			continue
		}
		section, _, _ = strings.Cut(section, "\n#")
		for _, part := range []string{"**Means**", "**First**: `kubectl egress", "**Fix**"} {
			assert.Contains(t, section, part, "%s's runbook", a)
		}
	}
	assert.ElementsMatch(t, []string{"EgressProxiesNoHealthyProxy", "EgressProxiesProbeFleetStale", "EgressProxiesLeaseRefusalsRising",
		"EgressProxiesRedisUnreachable", "EgressProxiesControllerNoLeader", "EgressProxiesQuarantineHeld", "EgressProxiesStoreFull"}, alerts)

	cm := find(t, objs, "ConfigMap", "ep-dashboard")
	assert.Equal(t, "1", cm.GetLabels()["grafana_dashboard"], "the label Grafana's sidecar loads")
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "egress-proxies.json")
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal([]byte(raw), &dash))
	require.NotEmpty(t, dash.Panels)
	for _, p := range dash.Panels {
		require.NotEmpty(t, p.Targets, p.Title)
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, e := range exprs {
		ms := series.FindAllString(e, -1)
		assert.NotEmpty(t, ms, "reads no series of ours: %s", e)
		for _, m := range ms {
			assert.True(t, names[m], "%s is exported by no service (in %s)", m, e)
		}
		assert.Equal(t, strings.Count(e, "("), strings.Count(e, ")"), e)
		assert.Equal(t, strings.Count(e, "{"), strings.Count(e, "}"), e)
	}

	for _, kind := range []string{"ServiceMonitor", "PodMonitor"} {
		n := 0
		for _, u := range objs {
			if u.GetKind() == kind {
				n++
				assert.Equal(t, "kps", u.GetLabels()["release"], "%s %s carries the labels Prometheus selects by", kind, u.GetName())
			}
		}
		assert.Positive(t, n, kind)
	}
	pm := find(t, objs, "PodMonitor", "ep-prober")
	sel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	assert.Equal(t, "prober", sel["app.kubernetes.io/component"], "probers, which have no Service, are scraped per pod")
}
