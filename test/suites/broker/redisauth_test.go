package broker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// The broker reaches a Redis that asks what a managed one does: TLS with
// a private CA, an ACL user of its own, a password from a mounted file.
// The password rotates with no restart: the file changes, Redis drops the
// old one and the broker's connections, and leasing goes on with the new.
func TestRedisOverTLSWithAnACLUserAndARotatedPassword(t *testing.T) {
	f := newFleet(t)
	f.add("r0", "127.0.0.95", nil)
	dir := t.TempDir()
	ca, err := certs.NewCA("redis test CA")
	require.NoError(t, err)
	files, err := ca.WriteServer(dir, "127.0.0.1")
	require.NoError(t, err)
	tlsPort := proc.FreePort(t)
	r := proc.StartRedis(t, false, "--tls-port", fmt.Sprint(tlsPort), "--tls-cert-file", files.Cert, "--tls-key-file", files.Key,
		"--tls-ca-cert-file", files.CA, "--tls-auth-clients", "no")
	admin := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer func() { _ = admin.Close() }()
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "broker", "on", ">first-pw", "~*", "&*", "+@all").Err())
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "default", "on", ">admin-pw").Err())
	admin = redis.NewClient(&redis.Options{Addr: r.Addr, Password: "admin-pw"})
	defer func() { _ = admin.Close() }()
	pwFile := filepath.Join(dir, "password")
	require.NoError(t, os.WriteFile(pwFile, []byte("first-pw\n"), 0o600))

	b := startBroker(t, f, &proc.Redis{Addr: proc.Addr(tlsPort)}, "--redis-tls-ca-file", files.CA, "--redis-username", "broker", "--redis-password-file", pwFile)
	c, err := leaseclient.Dial(b.GRPC)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	lease := func() error {
		l, err := c.Lease(ctx, leaseclient.Request{TTL: time.Minute})
		if err != nil {
			return err
		}
		return l.Release(ctx)
	}
	require.Eventually(t, func() bool { return lease() == nil }, 30*time.Second, 100*time.Millisecond)
	clients, err := admin.ClientList(ctx).Result()
	require.NoError(t, err)
	assert.Contains(t, clients, "user=broker", "the broker authenticates as its ACL user")
	assert.NotContains(t, strings.Join(b.Args, " "), "first-pw", "the password is in no argument")

	// Rotate: Redis takes both, the file the new one, Redis drops the old
	// one and every connection of the broker's.
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "broker", ">second-pw").Err())
	require.NoError(t, os.WriteFile(pwFile, []byte("second-pw\n"), 0o600))
	require.Eventually(t, func() bool { return strings.Contains(b.P.Log(), "Redis password file reloaded") },
		30*time.Second, 100*time.Millisecond, "the broker re-reads the file")
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "broker", "<first-pw").Err())
	require.NoError(t, admin.Do(ctx, "CLIENT", "KILL", "USER", "broker").Err())
	require.Eventually(t, func() bool { return lease() == nil }, 30*time.Second, 100*time.Millisecond, "leasing after the rotation")
}

// Sentinels that ask for a password of their own (requirepass in
// sentinel.conf): the broker finds the primary through them with it.
func TestSentinelWithItsOwnPassword(t *testing.T) {
	f := newFleet(t)
	f.add("s0", "127.0.0.96", nil)
	primary := proc.StartRedis(t, false)
	sentinels := proc.StartSentinels(t, "ep", primary.Addr, 1, "requirepass sentinel-pw")
	pwFile := filepath.Join(t.TempDir(), "sentinel-password")
	require.NoError(t, os.WriteFile(pwFile, []byte("sentinel-pw"), 0o600))
	b := startBroker(t, f, &proc.Redis{Addr: sentinels[0]}, "--redis-master-name", "ep", "--redis-sentinel-password-file", pwFile)
	c, err := leaseclient.Dial(b.GRPC)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	require.Eventually(t, func() bool {
		l, err := c.Lease(context.Background(), leaseclient.Request{TTL: time.Minute})
		return err == nil && l.Release(context.Background()) == nil
	}, 30*time.Second, 100*time.Millisecond)
}
