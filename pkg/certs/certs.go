// Package certs makes and serves the TLS of the probe stream: a small CA
// that issues server certificates (the demo's and the tests' own, never a
// production CA), and a server certificate that follows its files, so a
// Secret rotated by cert-manager takes effect without a restart.
package certs

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/filewatch"
)

// CA issues certificates.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// validity bounds every certificate it issues.
	validity time.Duration
	// PEM is the CA certificate, for clients to trust.
	PEM []byte
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}

// NewCA makes a CA valid for a day: long enough for any test or demo.
func NewCA(name string) (*CA, error) { return NewCAValidFor(name, 24*time.Hour) }

// NewCAValidFor makes a CA whose certificates, its own included, are valid
// for d (the real cluster's, which a developer may keep up for weeks).
func NewCAValidFor(name string, d time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(d),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, key: key, validity: d, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// KeyPEM is the CA's private key, for a signer that needs it (the real
// cluster's kube-controller-manager signs kubelet certificates with it).
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.key) }

// Pool holds only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue makes a server certificate for hosts (IP addresses or DNS names).
func (ca *CA) Issue(hosts ...string) (tls.Certificate, error) {
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: hosts[0]}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tmpl)
}

// IssueClient makes a client certificate: a Kubernetes API server reads
// the user from its common name and the groups from its organizations.
func (ca *CA) IssueClient(user string, groups ...string) (tls.Certificate, error) {
	return ca.issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (ca *CA) issue(tmpl *x509.Certificate) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial(), now.Add(-time.Hour), now.Add(ca.validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// Files are the PEM files of a server certificate, its key, and its CA,
// named as a kubernetes.io/tls Secret's keys are.
type Files struct{ Cert, Key, CA string }

// WriteServer issues a certificate for hosts and writes it, its key and
// the CA into dir as tls.crt, tls.key and ca.crt.
func (ca *CA) WriteServer(dir string, hosts ...string) (Files, error) {
	c, err := ca.Issue(hosts...)
	if err != nil {
		return Files{}, err
	}
	certPEM, keyPEM, err := PEM(c)
	if err != nil {
		return Files{}, err
	}
	f := Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
	for path, b := range map[string][]byte{f.Cert: certPEM, f.Key: keyPEM, f.CA: ca.PEM} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// PEM encodes an issued certificate and its key.
func PEM(c tls.Certificate) (certPEM, key []byte, err error) {
	key, err = keyPEM(c.PrivateKey)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Certificate[0]}), key, nil
}

func keyPEM(key any) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Reloading serves the certificate in a pair of files and re-reads them
// when their content changes.
type Reloading struct {
	certFile, keyFile string
	mu                sync.RWMutex
	cert              *tls.Certificate
	certPEM, keyPEM   []byte
}

// NewReloading loads the pair, failing if it does not load, and follows
// it until ctx ends.
func NewReloading(ctx context.Context, log *slog.Logger, certFile, keyFile string) (*Reloading, error) {
	r := &Reloading{certFile: certFile, keyFile: keyFile}
	if _, err := r.reload(); err != nil {
		return nil, err
	}
	filewatch.Follow(ctx, log, filewatch.Interval, "TLS certificate", certFile, r.reload)
	return r, nil
}

// reload compares content, not mtime: a mounted Secret changes through a
// symlink swap.
func (r *Reloading) reload() (bool, error) {
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return false, err
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return false, err
	}
	r.mu.RLock()
	same := bytes.Equal(certPEM, r.certPEM) && bytes.Equal(keyPEM, r.keyPEM)
	r.mu.RUnlock()
	if same {
		return false, nil
	}
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return false, fmt.Errorf("%s and %s: %w", r.certFile, r.keyFile, err)
	}
	r.mu.Lock()
	r.cert, r.certPEM, r.keyPEM = &c, certPEM, keyPEM
	r.mu.Unlock()
	return true, nil
}

// ServerConfig is a TLS 1.2+ server configuration serving the current
// certificate.
func (r *Reloading) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		r.mu.RLock()
		defer r.mu.RUnlock()
		return r.cert, nil
	}}
}

// ClientConfig trusts only the CA bundle in caFile, read now: a client
// that makes a connection per stream reads it per stream, and so follows
// a rotated CA. serverName "" verifies the dialed host.
func ClientConfig(caFile, serverName string) (*tls.Config, error) {
	pool, err := LoadPool(caFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ServerName: serverName}, nil
}

// LoadPool reads a PEM CA bundle; the error names the file.
func LoadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}
