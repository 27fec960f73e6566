package proc

import (
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Lifecycle checks what every binary promises: it starts, answers
// healthURL and metricsURL (which must serve Prometheus text), and exits 0
// on SIGTERM.
func Lifecycle(t *testing.T, name, bin string, env []string, args []string, healthURL, metricsURL string) {
	t.Helper()
	p := StartEnv(t, name, env, bin, args...)
	WaitHTTP(t, p, healthURL, 60*time.Second)
	// Each listener comes up on its own: health answering says nothing of
	// metrics (controller-runtime starts them side by side).
	WaitHTTP(t, p, metricsURL, 60*time.Second)

	resp, err := http.Get(metricsURL)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(body), "# TYPE go_goroutines gauge", "metrics are Prometheus text")

	p.Signal(syscall.SIGTERM)
	code, err := p.Wait(30 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code, "exit code after SIGTERM; log:\n%s", p.Log())
	assert.Contains(t, p.Log(), `"msg":"shut down cleanly"`, "logs are JSON")
}

// BadFlag checks that args make the binary exit non-zero at once with a
// message containing every fragment of want.
func BadFlag(t *testing.T, name, bin string, args []string, want ...string) {
	t.Helper()
	p := Start(t, name, bin, args...)
	code, err := p.Wait(30 * time.Second)
	require.NoError(t, err)
	assert.NotEqual(t, 0, code)
	for _, w := range want {
		assert.Contains(t, strings.ToLower(p.Log()), strings.ToLower(w))
	}
}
