package proc

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis is a real redis-server on a loopback port with its own directory.
type Redis struct {
	Addr string
	Port int
	Dir  string
	AOF  bool
	// Args are extra redis-server arguments ("--replicaof", ...).
	Args []string
	Proc *Process
	t    T
}

// RedisBinary finds redis-server or skips the test saying how to get it.
func RedisBinary(t T) string {
	t.Helper()
	for _, p := range []string{"redis-server", "/usr/bin/redis-server", "/usr/sbin/redis-server"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Fatalf("redis-server not found: run `make deps` (apt-get install redis-server)")
	return ""
}

// StartRedis starts redis-server on a free loopback port; with aof, every
// write is appended and fsynced, so a restart keeps the data.
func StartRedis(t T, aof bool, args ...string) *Redis {
	t.Helper()
	if tb, ok := t.(testing.TB); ok {
		RequireProcesses(tb)
	}
	r := &Redis{Dir: t.TempDir(), AOF: aof, Args: args, t: t}
	startListening(t, func() int { return FreePort(t) }, func(port int) error {
		r.Port, r.Addr = port, Addr(port)
		return r.start()
	})
	return r
}

// Start (re)starts the server on the same port and directory.
func (r *Redis) Start() {
	r.t.Helper()
	startListening(r.t, func() int { return r.Port }, func(int) error { return r.start() })
}

func (r *Redis) start() error {
	args := []string{"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir,
		"--save", "", "--protected-mode", "no", "--daemonize", "no", "--logfile", ""}
	if r.AOF {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	r.Proc = Start(r.t, fmt.Sprintf("redis-%d", r.Port), RedisBinary(r.t), append(args, r.Args...)...)
	return waitListening(r.Proc, r.Addr, 10*time.Second, r.Proc.Log)
}

// StartSentinels starts n Redis Sentinels (redis-server --sentinel) on
// loopback watching the primary at primaryAddr as master, with a quorum of
// n/2+1 and a one-second down-after, and returns their addresses; conf
// lines are added to each one's config ("requirepass ...").
func StartSentinels(t T, master, primaryAddr string, n int, extra ...string) []string {
	t.Helper()
	host, port, _ := net.SplitHostPort(primaryAddr)
	var addrs []string
	for range n {
		dir := t.TempDir()
		p := startListening(t, func() int { return FreePort(t) }, func(p int) error {
			conf := filepath.Join(dir, "sentinel.conf")
			body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\nsentinel monitor %s %s %s %d\n", p, dir, master, host, port, n/2+1) +
				fmt.Sprintf("sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n", master, master) + strings.Join(extra, "\n") + "\n"
			if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			sentinel := Start(t, fmt.Sprintf("sentinel-%d", p), RedisBinary(t), conf, "--sentinel")
			return waitListening(sentinel, Addr(p), 10*time.Second, sentinel.Log)
		})
		addrs = append(addrs, Addr(p))
	}
	return addrs
}

// Kill stops the server with SIGKILL (data since the last fsync is lost
// without AOF).
func (r *Redis) Kill() { r.Proc.Kill() }
