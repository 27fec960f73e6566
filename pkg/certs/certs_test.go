package certs

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A server following its files serves a rotated certificate without a
// restart; a client trusting the CA file verifies it, and one trusting
// another CA does not.
func TestAServerFollowsItsFiles(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("test CA")
	require.NoError(t, err)
	files, err := ca.WriteServer(dir, "127.0.0.1", "controller.example")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, err := NewReloading(ctx, slog.Default(), files.Cert, files.Key)
	require.NoError(t, err)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", r.ServerConfig())
	require.NoError(t, err)
	defer func() { _ = ln.Close() }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	served := func(cfg *tls.Config) (*tls.ConnectionState, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
		if err != nil {
			return nil, err
		}
		defer func() { _ = c.Close() }()
		st := c.ConnectionState()
		return &st, nil
	}
	cfg, err := ClientConfig(files.CA, "")
	require.NoError(t, err)
	first, err := served(cfg)
	require.NoError(t, err)

	named, err := ClientConfig(files.CA, "controller.example")
	require.NoError(t, err)
	_, err = served(named)
	assert.NoError(t, err, "the DNS name is in the certificate")

	other, err := NewCA("other CA")
	require.NoError(t, err)
	_, err = served(&tls.Config{RootCAs: other.Pool(), MinVersion: tls.VersionTLS12})
	assert.ErrorContains(t, err, "certificate signed by unknown authority")

	_, err = ca.WriteServer(dir, "127.0.0.1")
	require.NoError(t, err)
	changed, err := r.reload()
	require.NoError(t, err)
	assert.True(t, changed)
	second, err := served(cfg)
	require.NoError(t, err)
	assert.NotEqual(t, first.PeerCertificates[0].SerialNumber, second.PeerCertificates[0].SerialNumber, "the rotated certificate is served")

	require.NoError(t, os.WriteFile(files.Key, []byte("garbage"), 0o600))
	_, err = r.reload()
	assert.Error(t, err)
	_, err = served(cfg)
	assert.NoError(t, err, "a broken rotation keeps the last good certificate")

	_, err = ClientConfig(files.Key, "")
	assert.ErrorContains(t, err, "holds no PEM certificate")
}
