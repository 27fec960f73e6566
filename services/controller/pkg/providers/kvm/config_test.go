package kvm_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/providers/kvm"
)

func validConfig() map[string]any {
	return map[string]any{
		"sshKeyFile": "/etc/proxy-operator/kvm/id_ed25519", "knownHostsFile": "/etc/proxy-operator/kvm/known_hosts",
		"machineTypes": map[string]any{"small": map[string]any{"vcpus": 1, "memoryMiB": 512}},
		"hosts":        map[string]any{"hv1": map[string]any{"address": "10.0.0.5", "user": "op", "pool": "default", "bridge": "br0"}},
		"images":       map[string]any{"debian": map[string]any{"url": "https://images.example/debian.qcow2", "checksum": "sha256:" + strings.Repeat("ab", 32)}},
	}
}

// Every bad block stops start-up with the entry and the field named.
func TestConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(map[string]any)
		want string
	}{
		{"no key", func(c map[string]any) { delete(c, "sshKeyFile") }, "kvm.sshKeyFile is required"},
		{"no known_hosts", func(c map[string]any) { delete(c, "knownHostsFile") }, "kvm.knownHostsFile is required unless insecureIgnoreHostKey is true"},
		{"no machine types", func(c map[string]any) { delete(c, "machineTypes") }, "kvm.machineTypes is required"},
		{"zero vcpus", func(c map[string]any) { c["machineTypes"] = map[string]any{"tiny": map[string]any{"memoryMiB": 512}} }, "kvm.machineTypes.tiny.vcpus must be at least 1"},
		{"no hosts", func(c map[string]any) { delete(c, "hosts") }, "kvm.hosts is required"},
		{"host without pool", func(c map[string]any) {
			c["hosts"] = map[string]any{"hv1": map[string]any{"address": "a", "user": "u", "bridge": "br0"}}
		}, "kvm.hosts.hv1.pool is required"},
		{"bridge and network", func(c map[string]any) {
			c["hosts"] = map[string]any{"hv1": map[string]any{"address": "a", "user": "u", "pool": "p", "bridge": "br0", "network": "default"}}
		}, "kvm.hosts.hv1 needs exactly one of bridge or network"},
		{"host name not a label", func(c map[string]any) {
			c["hosts"] = map[string]any{"HV_1": map[string]any{"address": "a", "user": "u", "pool": "p", "bridge": "br0"}}
		}, "kvm.hosts.HV_1: a host name must be a DNS label"},
		{"image without checksum", func(c map[string]any) {
			c["images"] = map[string]any{"debian": map[string]any{"url": "https://images.example/d.qcow2"}}
		}, `kvm.images.debian.checksum "" must be sha256:<64 hex digits>`},
		{"md5 checksum", func(c map[string]any) {
			c["images"] = map[string]any{"debian": map[string]any{"url": "u", "checksum": "md5:d41d8cd98f00b204e9800998ecf8427e"}}
		}, "must be sha256:<64 hex digits>"},
		{"keepalive too long", func(c map[string]any) { c["keepaliveSeconds"] = 301 }, "kvm.keepaliveSeconds 301 must be between 1 and 300 (0 for the default, 15)"},
		{"negative keepalive", func(c map[string]any) { c["keepaliveSeconds"] = -1 }, "kvm.keepaliveSeconds -1 must be between 1 and 300"},
		{"unknown field", func(c map[string]any) { c["sshKey"] = "x" }, `unknown field "sshKey"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := validConfig()
			c.edit(cfg)
			_, err := build(kvm.Type, "kvm-home", cfg)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "provider kvm-home")
			assert.Contains(t, err.Error(), c.want)
			assert.False(t, providers.IsUnavailable(err), "a config error stops start-up")
		})
	}
}

// Without the kvm-ssh Secret: kvm is unavailable (the manager starts, its
// Proxies fail); kvm2 builds and fails each dial until the Secret appears.
func TestMissingSecret(t *testing.T) {
	cfg := validConfig()
	dir := t.TempDir()
	cfg["sshKeyFile"], cfg["knownHostsFile"] = filepath.Join(dir, "id_ed25519"), filepath.Join(dir, "known_hosts")
	_, err := build(kvm.Type, "kvm-home", cfg)
	require.Error(t, err)
	assert.True(t, providers.IsUnavailable(err), "%v", err)
	assert.Contains(t, err.Error(), "is the kvm-ssh Secret created?")

	_, err = build(kvm.Type2, "kvm2-home", cfg)
	assert.NoError(t, err)

	cfg["insecureIgnoreHostKey"] = true
	delete(cfg, "knownHostsFile")
	key := filepath.Join(dir, "id_ed25519")
	require.NoError(t, os.WriteFile(key, []byte("not a key"), 0o600))
	_, err = build(kvm.Type, "kvm-home", cfg)
	assert.ErrorContains(t, err, "parsing SSH key "+key)
}
