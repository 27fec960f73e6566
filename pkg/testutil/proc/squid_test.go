package proc

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/squidconf"
)

// An outgoing connection that holds host:port makes Squid exit at once:
// start says so, naming the address.
func TestSquidOnAPortHeldByAnOutgoingConnection(t *testing.T) {
	RequireProcesses(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.8.9")}}
	held, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer held.Close()

	s := newSquid(t, "127.0.8.9")
	s.configure(held.LocalAddr().(*net.TCPAddr).Port, func(*squidconf.Config) {})
	err = s.start()
	assert.ErrorIs(t, err, errPortTaken)
	assert.ErrorContains(t, err, s.Addr)
}
