package proc

import (
	"net"
	"net/http"
	"net/http/httptest"
)

// Serve serves h on host (a port of its own), over TLS with httptest's
// certificate when withTLS, until the test ends: a site on a loopback
// address of the test's choosing, so each host is its own target.
func Serve(t T, host string, h http.Handler, withTLS bool) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("listening on %s: %v", host, err)
	}
	s := httptest.NewUnstartedServer(h)
	_ = s.Listener.Close()
	s.Listener = ln
	if withTLS {
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(s.Close)
	return s
}
