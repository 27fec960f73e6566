// Package tlstarget serves HTTPS on loopback with a CA minted for it alone,
// the probe target of tests and the demo: it answers 204 on /ok and echoes
// the caller's IP as text on /ip and as JSON ({"ip": ...}) on /json.
package tlstarget

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
)

// Target is a running HTTPS echo server.
type Target struct {
	URL    string // https://127.0.0.1:port
	CAFile string // PEM of its own CA
	CA     *x509.Certificate
	ca     *certs.CA
	srv    *http.Server
	ln     net.Listener
}

// Handler is the echo handler.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/ip", func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = fmt.Fprintln(w, host)
	})
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, "{\"ip\":%q}\n", host)
	})
	return mux
}

// Start listens on addr (e.g. 127.0.0.1:0) with a fresh CA whose PEM is
// written into dir.
func Start(addr, dir string) (*Target, error) {
	ca, err := certs.NewCA("egress-proxies test CA")
	if err != nil {
		return nil, err
	}
	leaf, err := ca.Issue("127.0.0.1", "::1", "localhost")
	if err != nil {
		return nil, err
	}
	caFile := filepath.Join(dir, "probe-target-ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o644); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: Handler(), ReadHeaderTimeout: 5 * time.Second, TLSConfig: &tls.Config{
		Certificates: []tls.Certificate{leaf}, MinVersion: tls.VersionTLS12,
	}}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return &Target{URL: "https://" + ln.Addr().String(), CAFile: caFile, CA: ca.Cert, ca: ca, srv: srv, ln: ln}, nil
}

// Pool is a CertPool holding only the target's CA.
func (t *Target) Pool() *x509.CertPool { return t.ca.Pool() }

// Close stops the server.
func (t *Target) Close() error { return t.srv.Close() }

// StartT starts a target on a free loopback port for a test and stops it
// when the test ends.
func StartT(t testing.TB) *Target {
	t.Helper()
	tg, err := Start("127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tg.Close() })
	return tg
}
