// Package node runs a single-node Kubernetes cluster on this machine from
// binaries built here (hack/cluster/bins.sh): etcd, the control plane,
// containerd with runc and the CNI plugins, the kubelet and kube-proxy, as
// processes of their own. Pods live on a bridge this package makes, with a
// private pod CIDR and no route out. Down undoes everything Up did to the
// host, which Up records before it does it.
package node

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
)

// Config places the cluster on the host.
type Config struct {
	// Bins holds every binary (bins.sh prints it).
	Bins string
	// State holds everything the cluster writes to disk; Run its sockets
	// (short: a unix socket path is at most 108 bytes).
	State string
	Run   string
	// Bridge is the pods' bridge; its address (the pod CIDR's first) is
	// the node's IP, where the API server and the kubelet listen.
	Bridge      string
	PodCIDR     netip.Prefix
	ServiceCIDR netip.Prefix
	NodeName    string
}

// Defaults are the settings of `make cluster-up`. The ranges are private
// and, on this machine, unused; EGRESS_PROXIES_CLUSTER_POD_CIDR and
// _SERVICE_CIDR move them where they are not.
func Defaults(bins string) Config {
	c := Config{
		Bins:        bins,
		State:       "/var/lib/egress-proxies-cluster",
		Run:         "/run/egress-proxies-cluster",
		Bridge:      "ep-cni0",
		PodCIDR:     netip.MustParsePrefix("10.244.0.0/24"),
		ServiceCIDR: netip.MustParsePrefix("10.96.0.0/16"),
		NodeName:    "egress-proxies-node",
	}
	if v := os.Getenv("EGRESS_PROXIES_CLUSTER_POD_CIDR"); v != "" {
		c.PodCIDR = netip.MustParsePrefix(v)
	}
	if v := os.Getenv("EGRESS_PROXIES_CLUSTER_SERVICE_CIDR"); v != "" {
		c.ServiceCIDR = netip.MustParsePrefix(v)
	}
	return c
}

// NodeIP is the bridge's address.
func (c Config) NodeIP() string { return c.PodCIDR.Addr().Next().String() }

// APIServiceIP is the kubernetes Service's ClusterIP; DNSIP kube-dns's.
func (c Config) APIServiceIP() string { return c.ServiceCIDR.Addr().Next().String() }

// DNSIP is the cluster DNS Service's ClusterIP (.10, as kubeadm has it).
func (c Config) DNSIP() string {
	a := c.ServiceCIDR.Addr().As4()
	a[3] = 10
	return netip.AddrFrom4(a).String()
}

// Server is the API server's URL.
func (c Config) Server() string { return fmt.Sprintf("https://%s:%d", c.NodeIP(), apiPort) }

// Kubeconfig is the administrator's kubeconfig.
func (c Config) Kubeconfig() string { return filepath.Join(c.State, "admin.kubeconfig") }

// Kubectl is the kubectl of the cluster's version.
func (c Config) Kubectl() string { return filepath.Join(c.Bins, "kubectl") }

// Ctr is containerd's own client, for importing images.
func (c Config) Ctr() []string {
	return []string{filepath.Join(c.Bins, "ctr"), "--address", c.containerdSock(), "--namespace", "k8s.io"}
}

// LocalPath is where the StorageClass's volumes live on the host.
func (c Config) LocalPath() string { return filepath.Join(c.State, "local-path") }

const (
	apiPort  = 6443
	etcdPort = 23790
	peerPort = 23800
)

func (c Config) pki() string            { return filepath.Join(c.State, "pki") }
func (c Config) logs() string           { return filepath.Join(c.State, "logs") }
func (c Config) pids() string           { return filepath.Join(c.Run, "pids") }
func (c Config) containerdSock() string { return filepath.Join(c.Run, "containerd.sock") }
func (c Config) record() string         { return filepath.Join(c.State, "host-record.json") }

// Log is a component's log file.
func (c Config) Log(component string) string { return filepath.Join(c.logs(), component+".log") }

// fixedPaths are the host paths the node's binaries use whatever they are
// told (containerd's shims, the kubelet's device plugins and container log
// links, CNI's network namespaces). Up records which of them did not exist
// before it, and Down removes those.
var fixedPaths = []string{
	"/run/containerd", "/opt/containerd", "/run/netns", "/var/lib/kubelet",
	"/var/log/containers", "/var/log/pods", "/var/lib/cni",
}

// sysctls are the kernel settings the kubelet, kube-proxy and the bridge
// plugin change; Up records their values and Down puts them back.
var sysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
	"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet",
	"net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables",
	"net/netfilter/nf_conntrack_max",
	"net/netfilter/nf_conntrack_tcp_timeout_established", "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
}
