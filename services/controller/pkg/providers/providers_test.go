package providers_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/fake"
)

var types2 = []string{"kubernetes", "fake"}

// Every config error names the entry (by index, and by name once known)
// and what is wrong with it.
func TestParseConfigNamesWhatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"not yaml", "providers: [", []string{"parsing"}},
		{"unknown top-level field", "providers: []\nextra: 1\n", []string{"parsing", "extra"}},
		{"no name", "providers:\n- {type: fake}\n", []string{"providers[0]", "name is required"}},
		{"name not a string", "providers:\n- {name: [a], type: fake}\n", []string{"providers[0]", "name must be a string"}},
		{"name not a DNS label", "providers:\n- {name: GCP_EU, type: fake}\n", []string{"providers[0] (GCP_EU)", "DNS label"}},
		{"name too long", fmt.Sprintf("providers:\n- {name: %s, type: fake}\n", strings.Repeat("a", 64)), []string{"DNS label", "63"}},
		{"duplicate", "providers:\n- {name: a, type: fake}\n- {name: a, type: fake}\n", []string{"providers[1] (a)", `duplicate name "a"`}},
		{"no type", "providers:\n- {name: a}\n", []string{"providers[0] (a)", "type is required"}},
		{"unknown type", "providers:\n- {name: a, type: azure}\n", []string{`unknown type "azure"`, "[fake kubernetes]"}},
		{"block of another type", "providers:\n- {name: a, type: fake, kubernetes: {}}\n", []string{`unknown field "kubernetes"`, `go under "fake"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := providers.ParseConfig([]byte(tc.yaml), types2)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
	entries, err := providers.ParseConfig([]byte("providers:\n- {name: a, type: fake, fake: {x: 1}}\n- {name: b, type: kubernetes}\n"), types2)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.Equal(t, providers.Entry{Name: "a", Type: "fake", Block: []byte(`{"x":1}`)}, entries[0])
	assert.Empty(t, entries[1].Block)

	_, err = providers.LoadConfig("/nonexistent/providers.yaml", types2)
	assert.ErrorContains(t, err, "/nonexistent/providers.yaml")
}

func TestDecodeBlockRejectsUnknownFields(t *testing.T) {
	var cfg struct {
		Zone string `json:"zone"`
	}
	e := providers.Entry{Name: "a", Type: "gcp", Block: []byte(`{"zone":"z","zonee":"typo"}`)}
	err := e.DecodeBlock(&cfg)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "provider a: gcp")
	assert.Contains(t, err.Error(), "zonee")
	assert.NoError(t, providers.Entry{Name: "a"}.DecodeBlock(&cfg), "a missing block decodes as empty")
}

var instanceNameRule = regexp.MustCompile(`^px-[a-z0-9]([-a-z0-9]*[a-z0-9])?-[0-9a-f]{8}-[0-9]+$`)

// Instance names fit every backend's rules however long or odd the Proxy's
// name, and two Proxies never share one.
func TestInstanceNames(t *testing.T) {
	uid := types.UID("0b6a7c62-5a1e-4d0e-9a43-6d3b5b7d1f00")
	for _, tc := range []struct {
		name string
		gen  int64
	}{
		{"web", 1},
		{"Web.Crawler_01", 2},
		{strings.Repeat("a", 253), 1},
		{strings.Repeat("a", 60) + "-" + strings.Repeat("b", 10), 12345},
		{"x-", 1},
	} {
		n := providers.InstanceName(tc.name, uid, tc.gen)
		assert.LessOrEqual(t, len(n), 63, n)
		assert.Regexp(t, instanceNameRule, n)
		assert.True(t, strings.HasSuffix(n, fmt.Sprintf("-%d", tc.gen)), n)
		assert.Equal(t, n, providers.InstanceName(tc.name, uid, tc.gen), "deterministic")
	}
	assert.Equal(t, "px-web-", providers.InstanceName("web", uid, 1)[:7])
	assert.NotEqual(t, providers.InstanceName("web", uid, 1), providers.InstanceName("web", "another-uid", 1), "a re-created Proxy of the same name")
	assert.NotEqual(t, providers.InstanceName("web", uid, 1), providers.InstanceName("web", uid, 2), "the next generation")
	long := strings.Repeat("a", 100)
	assert.NotEqual(t, providers.InstanceName(long, uid, 1), providers.InstanceName(long+"b", "other", 1), "truncated names stay apart by UID")
}

// An entry whose factory says it is unavailable is kept, named and
// reported on every Get; any other factory error stops the registry.
func TestRegistry(t *testing.T) {
	ctx := context.Background()
	f := fake.New("good")
	factories := map[string]providers.Factory{
		"fake": func(_ context.Context, e providers.Entry, _ providers.Deps) (providers.Provider, error) {
			switch e.Name {
			case "good":
				return f, nil
			case "nocreds":
				return nil, &providers.UnavailableError{Entry: e.Name, Err: errors.New("credentials not mounted")}
			default:
				return nil, fmt.Errorf("provider %s: bad config", e.Name)
			}
		},
	}
	deps := providers.Deps{Log: slog.Default()}
	reg, err := providers.NewRegistry(ctx, []providers.Entry{{Name: "good", Type: "fake"}, {Name: "nocreds", Type: "fake"}}, factories, deps)
	require.NoError(t, err)
	assert.Equal(t, []string{"good", "nocreds"}, reg.Names())
	assert.Equal(t, []string{"good"}, keys(reg.Available()))

	_, err = reg.Get("nocreds")
	assert.True(t, providers.IsUnavailable(err))
	assert.ErrorContains(t, err, "credentials not mounted")
	_, err = reg.Get("gone")
	assert.True(t, providers.IsUnknownProvider(err))
	assert.ErrorContains(t, err, `"gone"`)
	assert.ErrorContains(t, err, "good, nocreds", "the error lists the entries there are")
	p, err := reg.Get("good")
	require.NoError(t, err)
	assert.NotSame(t, f, p, "every provider is wrapped in the metrics decorator")

	_, err = providers.NewRegistry(ctx, []providers.Entry{{Name: "broken", Type: "fake"}}, factories, deps)
	assert.ErrorContains(t, err, "provider broken: bad config")
	_, err = providers.NewRegistry(ctx, []providers.Entry{{Name: "a", Type: "azure"}}, factories, deps)
	assert.ErrorContains(t, err, `no factory for type "azure"`)
}

// The decorator labels every call with its caller, so a Delete by orphan
// GC and one by the reconciler are told apart.
func TestDecoratorLabelsTheCaller(t *testing.T) {
	f := fake.New("caller-test")
	f.DeleteErr = func() error { return errors.New("backend down") }
	p := providers.Instrument(f, "caller-test", "fake")
	reg := prometheus.NewRegistry()
	reg.MustRegister(providers.Collectors()...)
	before := func(caller string) float64 {
		v, err := promtext.Gathered(reg, "proxy_operator_provider_errors_total", "caller", caller)
		require.NoError(t, err)
		return v
	}
	gc, lc, unknown := before(providers.CallerGC), before(providers.CallerLifecycle), before("unknown")
	ctx := context.Background()
	assert.Error(t, p.Delete(providers.WithCaller(ctx, providers.CallerGC), "fake://caller-test/x"))
	assert.Error(t, p.Delete(providers.WithCaller(ctx, providers.CallerGC), "fake://caller-test/y"))
	assert.Error(t, p.Delete(providers.WithCaller(ctx, providers.CallerLifecycle), "fake://caller-test/z"))
	assert.Error(t, p.Delete(ctx, "fake://caller-test/w"))
	assert.Equal(t, gc+2, before(providers.CallerGC))
	assert.Equal(t, lc+1, before(providers.CallerLifecycle))
	assert.Equal(t, unknown+1, before("unknown"))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
