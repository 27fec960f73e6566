package install

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// chartAddress is an address of one of the chart's Services as docs
// write it: an optional scheme, a host naming the broker, the gateway or
// the discovery Service, an optional namespace (and .svc), a port.
var chartAddress = regexp.MustCompile(`(?:(grpcs?|https?)://)?([a-z][a-z0-9-]*(?:broker|gateway|discovery)[a-z0-9-]*)(?:\.([a-z0-9-]+)(?:\.svc(?:\.cluster\.local)?)?)?:([0-9]{2,5})\b`)

// docFiles are what a crawler team or an operator reads for an address:
// the docs, the clients' and examples' READMEs and docstrings.
func docFiles(t *testing.T) []string {
	root := testenv.RepoRoot()
	var files []string
	for _, pattern := range []string{"README.md", "docs/*.md", "docs/*/*.md", "clients/*/README.md", "clients/python/egress_proxies/*.py",
		"clients/node/src/*.ts", "examples/*/README.md", "examples/crawlee/main.js", "examples/scrapy/*/*.py", "charts/egress-proxies/values.yaml",
		"charts/egress-proxies/templates/NOTES.txt"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		require.NoError(t, err)
		files = append(files, m...)
	}
	require.NotEmpty(t, files)
	return files
}

// servicePorts are the rendered chart's Services' ports, by name.
func servicePorts(t *testing.T, args ...string) map[string][]int64 {
	out, err := helm(t, append([]string{"template", "egress-proxies", chart, "--namespace", "egress-proxies-system"}, args...)...)
	require.NoError(t, err, out)
	ports := map[string][]int64{}
	for _, u := range decode(t, out) {
		if u.GetKind() != "Service" {
			continue
		}
		list, _, _ := unstructured.NestedSlice(u.Object, "spec", "ports")
		for _, p := range list {
			switch n := p.(map[string]any)["port"].(type) {
			case int64:
				ports[u.GetName()] = append(ports[u.GetName()], n)
			case float64:
				ports[u.GetName()] = append(ports[u.GetName()], int64(n))
			}
		}
	}
	return ports
}

// Every address of the chart's Services that the docs and examples name
// is one the chart serves: the Service exists under that name for the
// release egress-proxies in egress-proxies-system, on that port; and a
// TLS scheme (grpcs://, https://) is named only where TLS is, since the
// chart serves plaintext by default.
func TestDocsNameTheChartsAddresses(t *testing.T) {
	testenv.Require(t)
	plain := servicePorts(t)
	withTLS := servicePorts(t, "--set", "broker.tls.enabled=true", "--set", "broker.tls.secretName=t", "--set", "broker.gateway.tls.enabled=true")
	checked := 0
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		rel, _ := filepath.Rel(testenv.RepoRoot(), file)
		lines := strings.Split(string(b), "\n")
		for i, line := range lines {
			for _, m := range chartAddress.FindAllStringSubmatchIndex(line, -1) {
				if m[0] > 0 && strings.ContainsRune("<>-{$./", rune(line[m[0]-1])) {
					continue // a placeholder (<release>-gateway), a template, or part of a longer name
				}
				scheme, host, port := sub(line, m, 1), sub(line, m, 2), sub(line, m, 4)
				ns := sub(line, m, 3)
				where := rel + ":" + strconv.Itoa(i+1) + ": " + line[m[0]:m[1]]
				checked++
				tls := scheme == "grpcs" || scheme == "https"
				ports := plain
				if tls {
					ports = withTLS
					context := strings.ToLower(strings.Join(lines[max(0, i-3):i+1], " "))
					assert.Contains(t, context, "tls", "%s: a TLS address where the text does not say TLS is on (the chart serves plaintext by default)", where)
				}
				n, _ := strconv.ParseInt(port, 10, 64)
				if assert.Contains(t, ports, host, "%s: the chart has no Service %s", where, host) {
					assert.True(t, slices.Contains(ports[host], n), "%s: Service %s serves %v, not %d", where, host, ports[host], n)
				}
				if ns != "" {
					assert.Equal(t, "egress-proxies-system", ns, "%s: the docs' namespace is egress-proxies-system", where)
				}
			}
		}
	}
	t.Logf("%d addresses checked", checked)
	assert.Greater(t, checked, 10, "the docs name the chart's addresses")
}

func sub(s string, m []int, i int) string {
	if m[2*i] < 0 {
		return ""
	}
	return s[m[2*i]:m[2*i+1]]
}
