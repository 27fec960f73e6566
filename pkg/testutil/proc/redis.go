package proc

import (
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Redis is a real redis-server on a loopback port with its own directory.
type Redis struct {
	Addr string
	Port int
	Dir  string
	AOF  bool
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
func StartRedis(t T, aof bool) *Redis {
	t.Helper()
	if tb, ok := t.(testing.TB); ok {
		RequireProcesses(tb)
	}
	r := &Redis{Port: FreePort(t), Dir: t.TempDir(), AOF: aof, t: t}
	r.Addr = Addr(r.Port)
	r.Start()
	return r
}

// Start (re)starts the server on the same port and directory.
func (r *Redis) Start() {
	r.t.Helper()
	args := []string{"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir,
		"--save", "", "--protected-mode", "no", "--daemonize", "no", "--logfile", ""}
	if r.AOF {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	r.Proc = Start(r.t, fmt.Sprintf("redis-%d", r.Port), RedisBinary(r.t), args...)
	WaitTCP(r.t, r.Addr, 10*time.Second)
}

// Kill stops the server with SIGKILL (data since the last fsync is lost
// without AOF).
func (r *Redis) Kill() { r.Proc.Kill() }
