package netpolicy

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultEgressKeepsClientsOutside(t *testing.T) {
	e := DefaultEgress()
	for _, tc := range []struct {
		ip      string
		port    uint16
		connect bool
		denied  string // "" when allowed
	}{
		{"93.184.216.34", 443, true, ""},
		{"93.184.216.34", 80, false, ""},
		{"2606:2800:220:1::1", 443, true, ""},
		{"169.254.169.254", 80, false, "169.254.0.0/16"},
		{"127.0.0.1", 443, true, "127.0.0.0/8"},
		{"::1", 443, true, "::1/128"},
		{"::ffff:10.1.2.3", 443, true, "10.0.0.0/8"},
		{"10.96.0.1", 443, true, "10.0.0.0/8"},
		{"172.20.0.5", 80, false, "172.16.0.0/12"},
		{"192.168.1.1", 80, false, "192.168.0.0/16"},
		{"100.64.0.1", 80, false, "100.64.0.0/10"},
		{"fd00:ec2::254", 80, false, "fc00::/7"},
		{"fe80::1", 80, false, "fe80::/10"},
		{"fe80::1%eth0", 80, false, "fe80::/10"},
		{"::1%lo", 443, true, "::1/128"},
		{"fd00::1%2", 443, true, "fc00::/7"},
		{"64:ff9b::a9fe:a9fe", 80, false, "carries 169.254.169.254"},
		{"64:ff9b::a00:1", 443, true, "carries 10.0.0.1"},
		{"64:ff9b::5db8:d822", 443, true, ""},
		{"2002:a9fe:a9fe::1", 80, false, "carries 169.254.169.254"},
		{"2002:7f00:1::", 443, true, "carries 127.0.0.1"},
		{"2002:5db8:d822::1", 443, true, ""},
		{"0.0.0.0", 80, false, "0.0.0.0/8"},
		{"93.184.216.34", 22, false, "port 22 is not an egress port"},
		{"93.184.216.34", 80, true, "CONNECT to port 80 is not allowed"},
	} {
		err := e.Check(netip.MustParseAddr(tc.ip), tc.port, tc.connect)
		if tc.denied == "" {
			assert.NoError(t, err, tc.ip)
			continue
		}
		var de *DeniedError
		require.True(t, errors.As(err, &de), "%s:%d: got %v", tc.ip, tc.port, err)
		assert.Contains(t, err.Error(), tc.denied, tc.ip)
	}
}

func TestAllowanceLetsATestTargetThroughAndNothingElse(t *testing.T) {
	e, err := ParseEgress(DefaultEgressDenyCIDRs, "127.0.0.2/32", "443", "443")
	require.NoError(t, err)
	assert.NoError(t, e.Check(netip.MustParseAddr("127.0.0.2"), 34567, true), "the allowance passes any port")
	assert.Error(t, e.Check(netip.MustParseAddr("127.0.0.1"), 34567, true))
	assert.Error(t, e.CheckHost("[::1]", 443, true))
	assert.NoError(t, e.CheckHost("example.com", 443, true), "a name is checked where it is resolved")
}

func TestParseEgressNamesTheBadValue(t *testing.T) {
	for _, tc := range []struct{ deny, allow, ports, tls, want string }{
		{"10.0.0.0/33", "", "80", "443", `egress-deny-cidrs: "10.0.0.0/33" is not a CIDR`},
		{"", "x", "80", "443", `egress-allowance-cidrs: "x" is not a CIDR`},
		{"", "", "80,0", "443", `egress-ports: "0" is not a port`},
		{"", "", "90-80", "443", `egress-ports: "90-80" is not a port`},
		{"", "", "80", "70000", `egress-tls-ports: "70000" is not a port`},
		{"", "", "", "443", "egress-ports: at least one port is needed"},
	} {
		_, err := ParseEgress(tc.deny, tc.allow, tc.ports, tc.tls)
		assert.ErrorContains(t, err, tc.want)
	}
	ps, err := ParsePorts("80, 8000-8999")
	require.NoError(t, err)
	assert.Equal(t, "80,8000-8999", ps.String())
	assert.True(t, ps.Has(8500))
	assert.False(t, ps.Has(9000))
}

func TestSquidRulesDenyBeforeAnyAllow(t *testing.T) {
	e, err := ParseEgress("10.0.0.0/8,169.254.0.0/16", "127.0.0.2/32", "80,443", "443")
	require.NoError(t, err)
	assert.Equal(t, `acl egress_allowance dst 127.0.0.2/32
acl egress_denied dst 10.0.0.0/8 169.254.0.0/16
acl egress_ports port 80 443
http_access deny manager
http_access allow egress_allowance egress_authenticated
http_access deny egress_denied
http_access deny !egress_ports
http_access allow egress_authenticated
http_access deny all
`, e.SquidRules("egress_authenticated"))
}

// The samples' cloud-init Squid configs (gcp, kvm) deny what the default
// policy denies: they are the one copy not rendered from this package.
func TestSamplesDenyTheDefaultList(t *testing.T) {
	d, err := Parse(DefaultEgressDenyCIDRs)
	require.NoError(t, err)
	for _, f := range []string{"proxy_kvm.yaml", "proxy_gcp.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "samples", f))
		require.NoError(t, err)
		var listed []string
		for _, line := range strings.Split(string(b), "\n") {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "acl egress_denied dst "); ok {
				listed = append(listed, strings.Fields(rest)...)
			}
		}
		assert.ElementsMatch(t, d.strings(), listed, f)
		assert.Contains(t, string(b), "http_access deny egress_denied\n", f)
	}
}
