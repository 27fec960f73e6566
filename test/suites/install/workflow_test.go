package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	yaml "go.yaml.in/yaml/v3"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// actionlint runs the linter pinned in hack/tools on dir's workflows.
func actionlint(t *testing.T, dir string) (string, error) {
	t.Helper()
	cmd := exec.Command("go", "tool", "actionlint")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(testenv.RepoRoot(), "hack", "tools", "go.work"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The image workflow passes actionlint, and keeps the seed's tag rules:
// it runs on tags and by hand, never on branches; it builds the three
// services from the one Dockerfile; latest moves on tag pushes only.
func TestImageWorkflow(t *testing.T) {
	testenv.Require(t)
	out, err := actionlint(t, testenv.RepoRoot())
	require.NoError(t, err, out)

	// The linter does lint: a workflow with an undefined step output and
	// a bad runner label fails it.
	bad := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(bad, ".git"), 0o755)) // actionlint looks for the repository's root
	require.NoError(t, os.MkdirAll(filepath.Join(bad, ".github", "workflows"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bad, ".github", "workflows", "bad.yaml"), []byte(
		"on: push\njobs:\n  a:\n    runs-on: ubuntu-latst\n    steps:\n      - run: echo ${{ steps.nope.outputs.x }}\n"), 0o644))
	out, err = actionlint(t, bad)
	require.Error(t, err)
	assert.Contains(t, out, "ubuntu-latst")

	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), ".github", "workflows", "images.yaml"))
	require.NoError(t, err)
	var wf struct {
		On struct {
			Push struct {
				Tags     []string `yaml:"tags"`
				Branches []string `yaml:"branches"`
			} `yaml:"push"`
			WorkflowDispatch *struct{} `yaml:"workflow_dispatch"`
		} `yaml:"on"`
		Jobs map[string]struct {
			Strategy struct {
				Matrix struct {
					Service []string `yaml:"service"`
				} `yaml:"matrix"`
			} `yaml:"strategy"`
			Steps []struct {
				Uses string            `yaml:"uses"`
				Run  string            `yaml:"run"`
				With map[string]string `yaml:"with"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &wf))
	assert.Equal(t, []string{"*"}, wf.On.Push.Tags)
	assert.Empty(t, wf.On.Push.Branches)
	assert.NotNil(t, wf.On.WorkflowDispatch)
	build := wf.Jobs["build"]
	assert.Equal(t, []string{"controller", "prober", "broker"}, build.Strategy.Matrix.Service)
	var script string
	for _, s := range build.Steps {
		script += s.Run
		if s.Uses == "docker/build-push-action@v6" {
			assert.Contains(t, s.With["build-args"], "SERVICE=${{ matrix.service }}")
		}
	}
	assert.Contains(t, script, `sha-$commit`)
	assert.Contains(t, script, `if [ "$GITHUB_EVENT_NAME" = push ]; then tags="$tags,$image:latest"; fi`, "latest only on real tags")
}
