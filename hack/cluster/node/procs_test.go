package node

import (
	"os/exec"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A node's process is its binary with its own arguments: another process
// of the same binary (envtest's etcd beside the node's) is not the node's.
func TestProcessesOfMatchesTheArguments(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	require.NoError(t, err)
	ours := exec.Command(sleep, "300.017", "1")
	other := exec.Command(sleep, "300.017", "2")
	for _, c := range []*exec.Cmd{ours, other} {
		require.NoError(t, c.Start())
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	assert.Equal(t, []int{ours.Process.Pid}, processesOf(sleep, "300.017", "1"))
	assert.Subset(t, processesOf(sleep), []int{ours.Process.Pid, other.Process.Pid}, "without arguments, every process of the binary")
	assert.Empty(t, processesOf(sleep, "300.017"), "a prefix of the arguments is not them (a number no other sleep on the machine is likely to have)")
}
