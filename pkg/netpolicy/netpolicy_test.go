package netpolicy

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultDenyListKeepsMetadataOutAndPrivateRangesIn(t *testing.T) {
	d, err := Parse(DefaultDenyCIDRs)
	require.NoError(t, err)
	for _, tc := range []struct {
		host   string
		denied bool
	}{
		{"169.254.169.254", true},
		{"169.254.0.1", true},
		{"[fe80::1]", true},
		{"[fe80::1%eth0]", true},
		{"fd00:ec2::254%1", true},
		{"fd00:ec2::254", true},
		{"::ffff:169.254.169.254", true},
		{"10.0.0.5", false},
		{"192.168.1.1", false},
		{"172.16.0.1", false},
		{"127.0.0.1", false},
		{"metadata.google.internal", false}, // a name: checked where it is dialed
	} {
		_, denied := d.DeniesHost(tc.host)
		assert.Equal(t, tc.denied, denied, tc.host)
	}
}

func TestParseNamesTheBadEntry(t *testing.T) {
	_, err := Parse("10.0.0.0/8, 169.254.0.0/33")
	assert.ErrorContains(t, err, `"169.254.0.0/33" is not a CIDR`)
	d, err := Parse("")
	require.NoError(t, err)
	assert.Empty(t, d)
	d, err = Parse(" 10.1.2.3/8 ")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.0/8", d.String())
}

// A dialer with the deny list's Control refuses a denied address before
// any packet is sent, and lets others through.
func TestControlRefusesADeniedDial(t *testing.T) {
	d, err := Parse("127.0.0.2/32")
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	dialer := net.Dialer{Control: d.Control}
	c, err := dialer.DialContext(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	_ = c.Close()

	_, port, _ := net.SplitHostPort(ln.Addr().String())
	_, err = dialer.DialContext(context.Background(), "tcp", net.JoinHostPort("127.0.0.2", port))
	var de *DeniedError
	require.True(t, errors.As(err, &de), "got %v", err)
	assert.Equal(t, netip.MustParseAddr("127.0.0.2"), de.Addr)
	assert.Contains(t, err.Error(), "127.0.0.2 is in the deny list (127.0.0.2/32)")
}
