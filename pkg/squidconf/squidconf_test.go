package squidconf_test

import (
	"crypto/tls"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// TestAProxyIsNotAWayIn runs a real Squid with the config the kubernetes
// provider's pods run and sends, with the proxy's own credentials, what
// an attacker holding a lease would: every way inside gets 403, and only
// the allowed target answers. Nothing denied is dialed: Squid refuses on
// the destination before it connects.
func TestAProxyIsNotAWayIn(t *testing.T) {
	target := serve(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "reached")
	}), false)
	tlsTarget := serve(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "reached")
	}), true)
	// Something listening on 127.0.0.1 that must stay out of reach, as a
	// pod's own loopback services or a node's sshd would.
	inside := serve(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a denied destination was reached: %s", r.URL)
	}), false)
	egress, err := netpolicy.ParseEgress(netpolicy.DefaultEgressDenyCIDRs+","+netpolicy.DefaultClusterCIDRs, "127.0.0.2/32", netpolicy.DefaultEgressPorts, netpolicy.DefaultEgressTLSPorts)
	require.NoError(t, err)
	creds := proxyauth.Credentials{Username: "ep-lease", Password: "s3cret"}
	squid := proc.StartSquidWithEgress(t, "127.0.0.1", 0, creds, egress)
	proxy := &url.URL{Scheme: "http", User: url.UserPassword(creds.Username, creds.Password), Host: squid.Addr}
	c := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // the test target's own certificate

	for _, tc := range []struct{ name, url string }{
		{"cloud metadata", "http://169.254.169.254/computeMetadata/v1/"},
		{"the pod's loopback", "http://127.0.0.1:22/"},
		{"a loopback service", "http://" + inside + "/"},
		{"squid's cache manager", "http://" + squid.Addr + "/squid-internal-mgr/info"},
		{"the API server's Service", "http://10.96.0.1/"},
		{"a cluster Service over TLS", "https://10.96.0.10:443/"},
		{"a private range", "http://192.168.1.1/"},
		{"IPv6 loopback", "http://[::1]:80/"},
		{"a name for a private address", "http://localhost:80/"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := c.Get(tc.url)
			if err != nil {
				// Go's transport reports a refused CONNECT as an error
				// holding the proxy's status.
				assert.ErrorContains(t, err, "Forbidden")
				return
			}
			defer func() { _ = resp.Body.Close() }()
			assert.Equal(t, http.StatusForbidden, resp.StatusCode)
		})
	}
	for _, u := range []string{"http://" + target + "/", "https://" + tlsTarget + "/"} {
		resp, err := c.Get(u)
		require.NoError(t, err, u)
		assert.Equal(t, http.StatusOK, resp.StatusCode, u)
		_ = resp.Body.Close()
	}
	// Without the credentials the allowed target asks for them.
	anon := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: squid.Addr})}}
	resp, err := anon.Get("http://" + target + "/")
	require.NoError(t, err)
	assert.Equal(t, http.StatusProxyAuthRequired, resp.StatusCode)
	_ = resp.Body.Close()
}

// serve is proc.Serve's address.
func serve(t *testing.T, host string, h http.Handler, withTLS bool) string {
	return proc.Serve(t, host, h, withTLS).Listener.Addr().String()
}
