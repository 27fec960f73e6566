package node

import (
	"fmt"
	"os"
	"path/filepath"
)

// PauseImage is the sandbox image containerd pins (built here, never
// pulled).
const PauseImage = "egress-proxies.local/pause:3.10"

func (c Config) containerdConfig() string {
	return fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = %[3]q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %[4]q
  # Every registry resolves to a closed port on loopback: a missing image
  # fails at once, and no pull ever leaves the machine.
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = %[8]q

# This machine's root lacks CAP_SYS_RESOURCE: without the restriction
# every sandbox fails on oom_score_adj. No AppArmor here either.
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %[5]q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%[6]q]
    conf_dir = %[7]q
    max_conf_num = 1
`, filepath.Join(c.State, "containerd"), filepath.Join(c.Run, "containerd"), c.containerdSock(), PauseImage,
		filepath.Join(c.Bins, "runc"), c.Bins, c.cniConfDir(), c.registryDir())
}

func (c Config) registryDir() string { return filepath.Join(c.State, "registries") }

// noRegistry is every registry's hosts.toml: only the server named, on a
// loopback port nothing listens on.
const noRegistry = `server = "http://127.0.0.1:9"
`

func (c Config) cniConfDir() string { return filepath.Join(c.State, "cni", "net.d") }

// cniConfig puts pods on the bridge with addresses from the pod CIDR and
// the node as their gateway. No masquerade: nothing leaves the machine.
func (c Config) cniConfig() string {
	return fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "egress-proxies",
  "plugins": [
    {
      "type": "bridge",
      "bridge": %q,
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": %q,
        "ranges": [[{"subnet": %q, "gateway": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, c.Bridge, filepath.Join(c.State, "cni", "ipam"), c.PodCIDR.String(), c.NodeIP())
}

func (c Config) kubeletConfig() string {
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[2]q}
authorization: {mode: Webhook}
tlsCertFile: %[3]q
tlsPrivateKeyFile: %[4]q
clusterDomain: cluster.local
clusterDNS: [%[5]s]
containerRuntimeEndpoint: unix://%[6]s
cgroupDriver: cgroupfs
# This machine has cgroup v1 only.
failCgroupV1: false
failSwapOn: false
resolvConf: ""
podLogsDir: %[7]q
staticPodPath: ""
serializeImagePulls: false
# Only images built here run: none may be collected.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
maxPods: 110
`, c.NodeIP(), filepath.Join(c.pki(), "ca.crt"), filepath.Join(c.pki(), "kubelet.crt"), filepath.Join(c.pki(), "kubelet.key"),
		c.DNSIP(), c.containerdSock(), filepath.Join(c.State, "pod-logs"))
}

func (c Config) kubeProxyConfig() string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: %[1]q}
hostnameOverride: %[2]s
clusterCIDR: %[3]s
bindAddress: %[4]s
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# NodePorts on the bridge only, never on the machine's own interfaces.
nodePortAddresses: [%[4]s/32]
# Leave the host's conntrack settings as they are.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, filepath.Join(c.State, "kube-proxy.kubeconfig"), c.NodeName, c.PodCIDR.String(), c.NodeIP())
}

func writeFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, []byte(content), 0o644)
}

// components are the node's processes in start order.
func (c Config) components() []component {
	pki := func(f string) string { return filepath.Join(c.pki(), f) }
	kc := func(n string) string { return filepath.Join(c.State, n+".kubeconfig") }
	etcd := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	return []component{
		{name: "etcd", args: []string{"etcd", "--data-dir", filepath.Join(c.State, "etcd"),
			"--listen-client-urls", etcd, "--advertise-client-urls", etcd,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", "default=" + peer, "--listen-metrics-urls", "",
			// A test cluster on a shared disk: fsync would only slow it.
			"--unsafe-no-fsync"}},
		{name: "kube-apiserver", args: []string{"kube-apiserver",
			"--etcd-servers", etcd,
			"--bind-address", c.NodeIP(), "--advertise-address", c.NodeIP(), "--secure-port", fmt.Sprint(apiPort),
			"--service-cluster-ip-range", c.ServiceCIDR.String(),
			"--client-ca-file", pki("ca.crt"), "--tls-cert-file", pki("apiserver.crt"), "--tls-private-key-file", pki("apiserver.key"),
			"--kubelet-client-certificate", pki("apiserver-kubelet-client.crt"), "--kubelet-client-key", pki("apiserver-kubelet-client.key"),
			"--kubelet-certificate-authority", pki("ca.crt"), "--kubelet-preferred-address-types", "InternalIP",
			"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file", pki("sa.pub"), "--service-account-signing-key-file", pki("sa.key"),
			"--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
			"--allow-privileged=true", "--profiling=false"}},
		{name: "kube-controller-manager", args: []string{"kube-controller-manager",
			"--kubeconfig", kc("controller-manager"),
			"--authentication-kubeconfig", kc("controller-manager"), "--authorization-kubeconfig", kc("controller-manager"),
			"--bind-address", "127.0.0.1", "--leader-elect=false", "--use-service-account-credentials",
			"--service-account-private-key-file", pki("sa.key"), "--root-ca-file", pki("ca.crt"),
			"--cluster-signing-cert-file", pki("ca.crt"), "--cluster-signing-key-file", pki("ca.key"),
			"--service-cluster-ip-range", c.ServiceCIDR.String(), "--controllers", "*"}},
		{name: "kube-scheduler", args: []string{"kube-scheduler",
			"--kubeconfig", kc("scheduler"),
			"--authentication-kubeconfig", kc("scheduler"), "--authorization-kubeconfig", kc("scheduler"),
			"--bind-address", "127.0.0.1", "--leader-elect=false"}},
		{name: "containerd", args: []string{"containerd", "--config", filepath.Join(c.State, "containerd.toml")}},
		{name: "kubelet", args: []string{"kubelet",
			"--config", filepath.Join(c.State, "kubelet.yaml"), "--kubeconfig", kc("kubelet"),
			"--root-dir", filepath.Join(c.State, "kubelet"), "--node-ip", c.NodeIP(), "--hostname-override", c.NodeName}},
		{name: "kube-proxy", args: []string{"kube-proxy", "--config", filepath.Join(c.State, "kube-proxy.yaml")}},
	}
}
