package proc

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/squidconf"
)

// An outgoing connection that holds host:port makes Squid exit at once:
// start says so, naming the address, rather than waiting out its deadline.
func TestSquidOnAPortHeldByAnOutgoingConnection(t *testing.T) {
	RequireProcesses(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.8.9")}}
	held, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer held.Close()

	dir, err := os.MkdirTemp("", "egress-proxies-squid-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o777))
	s := &Squid{Host: "127.0.8.9", Addr: held.LocalAddr().String(), Dir: dir, t: t}
	c := squidconf.Config{Listen: s.Addr, Dir: dir, OutgoingAddress: s.Host, ConnectTimeout: time.Second}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "squid.conf"), []byte(c.String()), 0o644))

	err = s.start()
	assert.ErrorIs(t, err, errPortTaken)
	assert.ErrorContains(t, err, s.Addr)
}
