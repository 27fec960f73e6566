package app

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
)

// The sample providers config in deploy/samples parses, and builds a
// registry here, where no GCP credentials and no kvm-ssh Secret exist: the
// gcp and kvm entries come up unavailable (the manager would start and
// warn) instead of failing, and kvm2, which reads the Secret on every
// dial, comes up usable and fails its Proxies until the Secret appears.
func TestSampleProvidersConfigLoads(t *testing.T) {
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", t.TempDir()+"/absent.json")
	entries, err := loadEntries(filepath.Join(testenv.RepoRoot(), "deploy", "samples", "providers-config.yaml"))
	require.NoError(t, err)
	require.Len(t, entries, 6)
	reg, err := providers.NewRegistry(context.Background(), entries, factories, providers.Deps{Namespace: "ns", Log: slog.Default()})
	require.NoError(t, err)
	assert.Equal(t, []string{"gcp-eu", "gcp-us", "kubernetes", "kubernetes-big", "kvm-home", "kvm2-lab"}, reg.Names())
	_, err = reg.Get("gcp-eu")
	assert.True(t, providers.IsUnavailable(err))
	_, err = reg.Get("kvm-home")
	assert.True(t, providers.IsUnavailable(err))
	assert.ErrorContains(t, err, "is the kvm-ssh Secret created?")
	_, err = reg.Get("kvm2-lab")
	assert.NoError(t, err)
	_, err = reg.Get("kubernetes")
	assert.NoError(t, err)
}
