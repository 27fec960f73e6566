package operator

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// The sample providers config in deploy/samples starts a controller.
func TestSampleProvidersConfigLoads(t *testing.T) {
	path := filepath.Join(testenv.RepoRoot(), "deploy", "samples", "providers-config.yaml")
	_, err := os.Stat(path)
	require.NoError(t, err)
	entries, err := loadEntries(path)
	require.NoError(t, err)
	require.Len(t, entries, 2)
}
