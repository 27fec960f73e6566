// Package pki makes the certificates of a single-node cluster: one CA that
// signs the API server's and the kubelet's serving certificates and every
// component's client certificate, the service-account signing key, and
// the kubeconfigs that carry them.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// validity outlasts any cluster a developer keeps up.
const validity = 365 * 24 * time.Hour

// CA signs the cluster's certificates.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	PEM  []byte
}

// NewCA makes a CA and writes ca.crt and ca.key into dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
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
	ca := &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	return ca, write(dir, "ca", ca.PEM, key)
}

// Pair is a certificate and key written as <name>.crt and <name>.key.
type Pair struct {
	Cert, Key string
	certPEM   []byte
	keyPEM    []byte
}

// Server issues a serving certificate for hosts (IPs or DNS names).
func (ca *CA) Server(dir, name string, hosts ...string) (Pair, error) {
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: hosts[0]}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(dir, name, tmpl)
}

// Client issues a client certificate: the API server reads the user from
// the common name and the groups from the organizations.
func (ca *CA) Client(dir, name, user string, groups ...string) (Pair, error) {
	return ca.issue(dir, name, &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (ca *CA) issue(dir, name string, tmpl *x509.Certificate) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	now := time.Now()
	tmpl.SerialNumber, tmpl.NotBefore, tmpl.NotAfter = serial(), now.Add(-time.Hour), now.Add(validity)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := write(dir, name, certPEM, key); err != nil {
		return Pair{}, err
	}
	keyPEM, _ := os.ReadFile(filepath.Join(dir, name+".key"))
	return Pair{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), certPEM: certPEM, keyPEM: keyPEM}, nil
}

// ServiceAccountKey writes the key pair service-account tokens are signed
// and verified with (sa.key, sa.pub).
func ServiceAccountKey(dir string) (priv, pub string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", err
	}
	if err := write(dir, "sa", nil, key); err != nil {
		return "", "", err
	}
	pub = filepath.Join(dir, "sa.pub")
	return filepath.Join(dir, "sa.key"), pub, os.WriteFile(pub, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644)
}

// Kubeconfig writes a kubeconfig for server with the pair's identity.
func (ca *CA) Kubeconfig(path, server string, p Pair) error {
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

func write(dir, name string, certPEM []byte, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if certPEM != nil {
		if err := os.WriteFile(filepath.Join(dir, name+".crt"), certPEM, 0o644); err != nil {
			return err
		}
	}
	return os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	return n
}
