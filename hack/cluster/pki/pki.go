// Package pki writes the certificates of a single-node cluster, issued by
// one pkg/certs CA: the API server's and the kubelet's serving
// certificates, every component's client certificate, the
// service-account signing key, and the kubeconfigs that carry them.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
)

// validity outlasts any cluster a developer keeps up.
const validity = 365 * 24 * time.Hour

// CA signs the cluster's certificates.
type CA struct{ *certs.CA }

// NewCA makes a CA and writes ca.crt and ca.key into dir.
func NewCA(dir, name string) (CA, error) {
	ca, err := certs.NewCAValidFor(name, validity)
	if err != nil {
		return CA{}, err
	}
	key, err := ca.KeyPEM()
	if err != nil {
		return CA{}, err
	}
	return CA{ca}, write(dir, "ca", ca.PEM, key)
}

// Pair is a certificate and key written as <name>.crt and <name>.key.
type Pair struct {
	Cert, Key       string
	certPEM, keyPEM []byte
}

// Server issues a serving certificate for hosts (IPs or DNS names).
func (ca CA) Server(dir, name string, hosts ...string) (Pair, error) {
	c, err := ca.Issue(hosts...)
	return pair(dir, name, c, err)
}

// Client issues a client certificate for user in groups.
func (ca CA) Client(dir, name, user string, groups ...string) (Pair, error) {
	c, err := ca.IssueClient(user, groups...)
	return pair(dir, name, c, err)
}

func pair(dir, name string, c tls.Certificate, err error) (Pair, error) {
	if err != nil {
		return Pair{}, err
	}
	certPEM, keyPEM, err := certs.PEM(c)
	if err != nil {
		return Pair{}, err
	}
	p := Pair{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), certPEM: certPEM, keyPEM: keyPEM}
	return p, write(dir, name, certPEM, keyPEM)
}

// ServiceAccountKey writes the key pair service-account tokens are signed
// and verified with (sa.key, sa.pub).
func ServiceAccountKey(dir string) (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	privDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	if err := write(dir, "sa", nil, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: privDER})); err != nil {
		return "", "", err
	}
	pub = filepath.Join(dir, "sa.pub")
	return filepath.Join(dir, "sa.key"), pub, os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
}

// Kubeconfig writes a kubeconfig for server with the pair's identity.
func (ca CA) Kubeconfig(path, server string, p Pair) error {
	b64 := base64.StdEncoding.EncodeToString
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: egress-proxies
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: user
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: egress-proxies
  context: {cluster: egress-proxies, user: user}
current-context: egress-proxies
`, server, b64(ca.PEM), b64(p.certPEM), b64(p.keyPEM))
	return os.WriteFile(path, []byte(cfg), 0o600)
}

func write(dir, name string, certPEM, keyPEM []byte) error {
	if certPEM != nil {
		if err := os.WriteFile(filepath.Join(dir, name+".crt"), certPEM, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, name+".key"), keyPEM, 0o600)
}
