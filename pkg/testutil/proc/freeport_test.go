package proc

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Ports handed out are bindable, never handed out twice, and below the
// kernel's ephemeral range, so no outgoing connection (nor a client's
// self-connect to a server not up yet) can take one before its service
// binds it.
func TestFreePortsAreOutsideTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	if low <= minPicked+1000 {
		t.Skipf("the ephemeral range starts at %d: no room below it", low)
	}
	seen := map[int]bool{}
	for range 200 {
		p := FreePort(t)
		assert.GreaterOrEqual(t, p, minPicked)
		assert.Less(t, p, low)
		assert.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
	}
	p := FreePort(t)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	require.NoError(t, err)
	require.NoError(t, ln.Close())
}
