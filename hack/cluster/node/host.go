package node

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

// hostRecord is what the host was like before Up changed it: Down reads
// it to put back exactly that and remove only what Up made.
type hostRecord struct {
	// Bins are the binaries the node ran, whose shims Down stops.
	Bins         string            `json:"bins"`
	Sysctls      map[string]string `json:"sysctls"`
	CreatedPaths []string          `json:"createdPaths"`
}

func (c Config) writeRecord() error {
	rec := hostRecord{Bins: c.Bins, Sysctls: map[string]string{}}
	for _, s := range sysctls {
		if b, err := os.ReadFile(filepath.Join("/proc/sys", s)); err == nil {
			rec.Sysctls[s] = strings.TrimSpace(string(b))
		}
	}
	for _, p := range fixedPaths {
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
			rec.CreatedPaths = append(rec.CreatedPaths, p)
		}
	}
	b, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(c.record(), b, 0o644)
}

func (c Config) readRecord() (hostRecord, bool) {
	var rec hostRecord
	b, err := os.ReadFile(c.record())
	if err != nil {
		return rec, false
	}
	return rec, json.Unmarshal(b, &rec) == nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// iptablesTools are the two families' iptables; the tables the node's
// components write chains into.
var (
	iptablesTools  = []string{"iptables", "ip6tables"}
	iptablesTables = []string{"filter", "nat", "mangle", "raw"}
	// ownedChains are the chain prefixes of the kubelet, kube-proxy, the
	// CNI plugins and this package.
	ownedChains = []string{"KUBE-", "CNI-", "EP-CLUSTER"}
)

// isolationChain drops whatever a pod sends that would leave the machine:
// pods reach each other, Services and the node, nothing else.
const isolationChain = "EP-CLUSTER-ISOLATION"

// foreignChains lists node chains that exist before Up runs: another
// node's, which Down must not remove, so Up refuses to start.
func foreignChains() []string {
	var found []string
	for _, tool := range iptablesTools {
		for _, table := range iptablesTables {
			out, err := exec.Command(tool, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(out), "\n") {
				if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" && owned(f[1]) {
					found = append(found, fmt.Sprintf("%s -t %s %s", tool, table, f[1]))
				}
			}
		}
	}
	return found
}

func owned(chain string) bool {
	for _, p := range ownedChains {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// network makes the bridge with the node's address, routes the Service
// range onto it (so no ClusterIP packet ever takes the default route),
// and isolates the pods.
func (c Config) network() error {
	ones := c.PodCIDR.Bits()
	steps := [][]string{
		{"ip", "link", "add", c.Bridge, "type", "bridge"},
		{"ip", "addr", "add", fmt.Sprintf("%s/%d", c.NodeIP(), ones), "dev", c.Bridge},
		{"ip", "link", "set", c.Bridge, "up"},
		{"ip", "route", "add", c.ServiceCIDR.String(), "dev", c.Bridge, "src", c.NodeIP()},
		{"iptables", "-w", "-N", isolationChain},
		{"iptables", "-w", "-A", isolationChain, "-i", c.Bridge, "-o", c.Bridge, "-j", "RETURN"},
		{"iptables", "-w", "-A", isolationChain, "-i", c.Bridge, "-j", "REJECT", "--reject-with", "icmp-net-unreachable"},
		{"iptables", "-w", "-I", "FORWARD", "1", "-j", isolationChain},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return err
		}
	}
	return nil
}

// removeChains deletes every chain the node made in every table, and the
// jumps into them from the built-in chains.
func removeChains() {
	for _, tool := range iptablesTools {
		for _, table := range iptablesTables {
			out, err := exec.Command(tool, "-w", "-t", table, "-S").Output()
			if err != nil {
				continue
			}
			var chains []string
			for _, line := range strings.Split(string(out), "\n") {
				f := splitRule(line)
				switch {
				case len(f) == 2 && f[0] == "-N" && owned(f[1]):
					chains = append(chains, f[1])
				case len(f) > 2 && f[0] == "-A" && !owned(f[1]) && jumpsToOwned(f):
					// A rule in a built-in chain: delete it by its spec.
					_ = exec.Command(tool, append([]string{"-w", "-t", table, "-D"}, f[1:]...)...).Run()
				}
			}
			for _, ch := range chains {
				_ = exec.Command(tool, "-w", "-t", table, "-F", ch).Run()
			}
			for _, ch := range chains {
				_ = exec.Command(tool, "-w", "-t", table, "-X", ch).Run()
			}
		}
	}
}

// splitRule splits a line of iptables -S into its arguments, as a shell
// would: a comment's words stay one argument.
func splitRule(line string) []string {
	var args []string
	var cur strings.Builder
	quoted, escaped, started := false, false, false
	for _, r := range line {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quoted:
			escaped = true
		case r == '"':
			quoted, started = !quoted, true
		case r == ' ' && !quoted:
			if started {
				args = append(args, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if started {
		args = append(args, cur.String())
	}
	return args
}

func jumpsToOwned(f []string) bool {
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && owned(f[i+1]) {
			return true
		}
	}
	return false
}

// unmountUnder detaches every mount at or below any of roots, deepest
// first: the kubelet's volume and rootfs mounts, containerd's snapshots,
// CNI's network namespaces.
func unmountUnder(roots ...string) {
	for _, p := range mountsUnder(roots...) {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}

// mountsUnder lists the mount points at or below roots, deepest first.
func mountsUnder(roots ...string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescape(fields[4])
		for _, r := range roots {
			if p == r || strings.HasPrefix(p, r+"/") {
				points = append(points, p)
				break
			}
		}
	}
	f.Close()
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points
}

// unescape reverses mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// cgroupRoots are the cgroups the kubelet (kubepods) and containerd
// (k8s.io, for containers outside a pod) make in each v1 hierarchy.
var cgroupRoots = []string{"kubepods", "k8s.io"}

// killCgroups kills every process in the node's cgroups: what a container
// left running after its shim went.
func killCgroups() {
	walkCgroups(func(dir string) {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return
		}
		for _, l := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(l, &pid); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
}

// removeCgroups removes the node's cgroups, children first.
func removeCgroups() {
	var dirs []string
	walkCgroups(func(dir string) { dirs = append(dirs, dir) })
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	for _, d := range dirs {
		_ = syscall.Rmdir(d)
	}
}

func walkCgroups(fn func(dir string)) {
	hierarchies, _ := os.ReadDir("/sys/fs/cgroup")
	for _, h := range hierarchies {
		for _, r := range cgroupRoots {
			root := filepath.Join("/sys/fs/cgroup", h.Name(), r)
			_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					fn(p)
				}
				return nil
			})
		}
	}
}

// restoreSysctls writes back the recorded values.
func restoreSysctls(rec hostRecord) {
	for k, v := range rec.Sysctls {
		_ = os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644)
	}
}
