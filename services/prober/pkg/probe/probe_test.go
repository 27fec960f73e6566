package probe_test

import (
	"context"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/tlstarget"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/probe"
)

// target is a local HTTPS echo server with a CA of its own.
func target(t *testing.T) (*tlstarget.Target, *x509.CertPool) {
	tg := tlstarget.StartT(t)
	return tg, tg.Pool()
}

func settings(url string, status int) probe.Settings {
	return probe.Settings{URL: url, ExpectedStatus: status, Timeout: 3 * time.Second}
}

func TestProbesThroughRealSquid(t *testing.T) {
	srv, pool := target(t)
	squid := proc.StartSquid(t, "127.0.0.1", false)
	denying := proc.StartSquid(t, "127.0.0.1", true)
	authed := proc.StartSquidWithAuth(t, "127.0.0.1", "crawler", "s3cret")
	withCreds := func(s probe.Settings, user, pass string) probe.Settings {
		s.Credentials = proxyauth.Credentials{Username: user, Password: pass}
		return s
	}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer plain.Close()

	silent := proc.SilentListener(t) // TCP up, no egress
	closedPort := proc.FreePort(t)

	good := &probe.Prober{RootCAs: pool}
	// The default egress policy, as in production: no allowance, so the
	// loopback targets are inside, named or not, and the proxy (an open
	// one, which would take the probe anywhere) is never asked.
	guarded := &probe.Prober{RootCAs: pool, Egress: netpolicy.DefaultEgress()}
	cases := []struct {
		name   string
		prober *probe.Prober
		proxy  string
		s      probe.Settings
		ok     bool
		phase  probev1.ProbePhase
		reason string
		egress string
	}{
		{"https through squid", good, squid.Addr, settings(srv.URL+"/ok", 204), true, 0, "", ""},
		{"http through squid", good, squid.Addr, settings(plain.URL+"/", 204), true, 0, "", ""},
		{"echo text", good, squid.Addr, probe.Settings{URL: srv.URL + "/ip", ExpectedStatus: 200, Timeout: 3 * time.Second, EchoFormat: "text"}, true, 0, "", "127.0.0.1"},
		{"echo json", good, squid.Addr, probe.Settings{URL: srv.URL + "/json", ExpectedStatus: 200, Timeout: 3 * time.Second, EchoFormat: "json:ip"}, true, 0, "", "127.0.0.1"},
		{"squid denies CONNECT", good, denying.Addr, settings(srv.URL+"/ok", 204), false, probev1.ProbePhase_PROBE_PHASE_CONNECT, "403 Forbidden", ""},
		{"squid denies http", good, denying.Addr, settings(plain.URL+"/", 204), false, probev1.ProbePhase_PROBE_PHASE_CONNECT, "403 Forbidden (ERR_ACCESS_DENIED", ""},
		{"tunnel never answers", good, silent, probe.Settings{URL: srv.URL + "/ok", ExpectedStatus: 204, Timeout: 500 * time.Millisecond}, false, probev1.ProbePhase_PROBE_PHASE_CONNECT, "timed out", ""},
		{"proxy down", good, proc.Addr(closedPort), settings(srv.URL+"/ok", 204), false, probev1.ProbePhase_PROBE_PHASE_DIAL, "refused", ""},
		{"unknown CA", &probe.Prober{}, squid.Addr, settings(srv.URL+"/ok", 204), false, probev1.ProbePhase_PROBE_PHASE_TLS, "certificate", ""},
		{"wrong status", good, squid.Addr, settings(srv.URL+"/missing", 204), false, probev1.ProbePhase_PROBE_PHASE_STATUS, "404", ""},
		{"https with credentials", good, authed.Addr, withCreds(settings(srv.URL+"/ok", 204), "crawler", "s3cret"), true, 0, "", ""},
		{"http with credentials", good, authed.Addr, withCreds(settings(plain.URL+"/", 204), "crawler", "s3cret"), true, 0, "", ""},
		{"credentials missing", good, authed.Addr, settings(srv.URL+"/ok", 204), false, probev1.ProbePhase_PROBE_PHASE_CONNECT, "407 Proxy Authentication Required", ""},
		{"wrong password", good, authed.Addr, withCreds(settings(srv.URL+"/ok", 204), "crawler", "guess"), false, probev1.ProbePhase_PROBE_PHASE_CONNECT, "407", ""},
		{"target inside, by address", guarded, squid.Addr, settings(srv.URL+"/ok", 204), false, probev1.ProbePhase_PROBE_PHASE_DIAL, "is outside the egress policy: 127.0.0.1 is in the deny list (127.0.0.0/8)", ""},
		{"target inside, by name", guarded, squid.Addr, settings("http://localhost:80/", 204), false, probev1.ProbePhase_PROBE_PHASE_DIAL, "localhost resolves to", ""},
		{"target port not allowed", guarded, squid.Addr, settings("https://198.51.100.1:22/", 204), false, probev1.ProbePhase_PROBE_PHASE_DIAL, "port 22 is not an egress port", ""},
		{"target name does not resolve", good, squid.Addr, settings("https://no-such-host.invalid/", 204), false, probev1.ProbePhase_PROBE_PHASE_DIAL, "no-such-host.invalid does not resolve here", ""},
		{"target down behind squid", good, squid.Addr, settings(fmt.Sprintf("https://127.0.0.1:%d/", closedPort), 204), false, probev1.ProbePhase_PROBE_PHASE_CONNECT, "503", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.prober.Do(context.Background(), tc.proxy, tc.s)
			assert.Equal(t, tc.ok, r.Success, "reason: %s", r.Reason)
			assert.Equal(t, tc.phase, r.Phase)
			assert.Contains(t, r.Reason, tc.reason)
			assert.Equal(t, tc.egress, r.EgressIP)
			assert.Positive(t, r.Latency)
			// What a metered proxy bills: every byte of a tunnel with TLS
			// (the handshake alone is kilobytes), none where nothing was
			// dialled.
			switch {
			case tc.phase == probev1.ProbePhase_PROBE_PHASE_DIAL:
				assert.Zero(t, r.Bytes)
			case tc.ok && strings.HasPrefix(tc.s.URL, "https"):
				assert.Greater(t, r.Bytes, int64(1000))
			case tc.name != "tunnel never answers":
				assert.Positive(t, r.Bytes)
			}
		})
	}
}

// A probe hands the proxy the address its check resolved, never the name
// (which the proxy would resolve again, perhaps elsewhere: DNS
// rebinding): Squid's log shows a tunnel to the address for an https and
// for a plain http target, and the site still sees its name (SNI, Host).
func TestProbesSendTheCheckedAddressNotTheName(t *testing.T) {
	srv, pool := target(t)
	var hosts []string
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hosts = append(hosts, r.Host)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer plain.Close()
	squid := proc.StartSquid(t, "127.0.0.1", false)
	p := &probe.Prober{RootCAs: pool}
	tlsURL := strings.Replace(srv.URL, "127.0.0.1", "localhost", 1) + "/ok"
	plainURL := strings.Replace(plain.URL, "127.0.0.1", "localhost", 1) + "/"
	for _, u := range []string{tlsURL, plainURL} {
		r := p.Do(context.Background(), squid.Addr, settings(u, 204))
		require.True(t, r.Success, "%s: %s", u, r.Reason)
	}
	assert.Equal(t, []string{strings.TrimPrefix(plainURL[:len(plainURL)-1], "http://")}, hosts, "the site is asked for by name")
	log := squid.Logged(
		"CONNECT 127.0.0.1:"+srv.URL[strings.LastIndex(srv.URL, ":")+1:],
		"CONNECT 127.0.0.1:"+plain.URL[strings.LastIndex(plain.URL, ":")+1:])
	assert.NotContains(t, log, "localhost", "the proxy was never given the name")
}
