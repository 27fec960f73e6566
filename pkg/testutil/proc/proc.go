// Package proc builds and runs the project's binaries and the real outside
// programs (redis-server, squid, sshd) as processes for tests, on loopback
// only, with logs kept in files a failing test points to.
package proc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// T is what this package needs of its caller: *testing.T and *testing.B
// satisfy it, and so does the demo's runner, which runs the same processes
// outside `go test`.
type T interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]string{}
	buildDir   string
)

// Build compiles a main package (an import path, e.g.
// github.com/egress-proxies/egress-proxies/services/broker/cmd/broker) once
// per test binary and returns the executable's path.
func Build(t T, pkg string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := buildCache[pkg]; ok {
		return p
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "egress-proxies-bin-")
		if err != nil {
			t.Fatal(err)
		}
		buildDir = d
	}
	out := filepath.Join(buildDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = repoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	buildCache[pkg] = out
	return out
}

func repoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.work")); err == nil {
			return d
		}
	}
	return dir
}

// Process is a running child process.
type Process struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string
	done    chan struct{}
	err     error
}

// Start runs bin with args, logging stdout and stderr to a file in the
// test's temp dir. The process is killed when the test ends if it still
// runs.
func Start(t T, name, bin string, args ...string) *Process {
	t.Helper()
	return StartEnv(t, name, nil, bin, args...)
}

// StartEnv is Start with extra environment variables ("K=V").
func StartEnv(t T, name string, env []string, bin string, args ...string) *Process {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("%s log (%s):\n%s", name, logPath, p.Log())
		}
	})
	return p
}

// Log returns what the process wrote so far.
func (p *Process) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(bytes.TrimSpace(b))
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) {
	if p.Cmd.Process != nil {
		_ = syscall.Kill(-p.Cmd.Process.Pid, sig)
	}
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.Signal(syscall.SIGKILL)
	<-p.done
}

// Wait waits up to d for the process to exit and returns its exit code
// (-1 on timeout or when killed by a signal).
func (p *Process) Wait(d time.Duration) (int, error) {
	select {
	case <-p.done:
	case <-time.After(d):
		return -1, fmt.Errorf("%s still running after %s", p.Name, d)
	}
	if p.err == nil {
		return 0, nil
	}
	if ee, ok := p.err.(*exec.ExitError); ok {
		return ee.ExitCode(), nil
	}
	return -1, p.err
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call.
func FreePort(t T) int {
	t.Helper()
	low := ephemeralLow()
	for {
		// Below the kernel's ephemeral range: a port picked from it could
		// be taken, between this check and the service's bind, as the
		// source port of any outgoing connection, or even by a client
		// dialing it before its server is up (TCP's self-connect).
		port := 0
		if low > minPicked+1000 {
			port = minPicked + rand.IntN(low-minPicked)
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			if port != 0 {
				continue // in use
			}
			t.Fatal(err)
		}
		port = ln.Addr().(*net.TCPAddr).Port
		_ = ln.Close()
		// The kernel may hand a just-closed port out again: two calls
		// before either port is bound (a service's ops and REST ports)
		// must not get the same one.
		handedOutMu.Lock()
		seen := handedOut[port]
		handedOut[port] = true
		handedOutMu.Unlock()
		if !seen {
			return port
		}
	}
}

// minPicked is the lowest port FreePort hands out.
const minPicked = 12000

// ephemeralLow is where the kernel's range of source ports begins, or
// Linux's default, 32768, when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return low
}

var (
	handedOutMu sync.Mutex
	handedOut   = map[int]bool{}
)

// Addr is "127.0.0.1:<port>".
func Addr(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// WaitHTTP polls url until it answers 200, the process exits, or d passes.
func WaitHTTP(t T, p *Process, url string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if p != nil && p.Exited() {
			t.Fatalf("%s exited before %s answered; log %s:\n%s", p.Name, url, p.LogPath, p.Log())
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s did not answer 200 within %s (last error %v); log %s", url, d, err, logOf(p))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// errPortTaken is a server's exit because its port was held: a port
// FreePort hands out is free on 127.0.0.1 at that moment, yet an outgoing
// connection (whose source port comes from the same ephemeral range) can
// take it before the server binds.
var errPortTaken = errors.New("port taken")

// waitListening polls addr until it accepts a connection; if p exits or d
// passes first, it kills p and says why from log (what p wrote, read
// then): errPortTaken when that names the bind failure.
func waitListening(p *Process, addr string, d time.Duration, log func() string) error {
	deadline := time.Now().Add(d)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return nil
		}
		exited := p.Exited()
		if exited || time.Now().After(deadline) {
			p.Kill()
			out := log()
			if strings.Contains(out, "Address already in use") {
				return fmt.Errorf("%s could not bind %s: %w", p.Name, addr, errPortTaken)
			}
			how := fmt.Sprintf("did not accept connections on %s within %s", addr, d)
			if exited {
				how = "exited before accepting connections on " + addr
			}
			return fmt.Errorf("%s %s (last dial: %v); its log:\n%s", p.Name, how, err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startListening starts a server on a port of pick's choosing until it
// listens and returns that port: a taken port means another one from
// pick, a few times over (a restart at a fixed port, whose pick returns it
// again, waits a second for the connection holding it to end).
func startListening(t T, pick func() int, start func(port int) error) int {
	t.Helper()
	last := 0
	for attempt := 1; ; attempt++ {
		port := pick()
		if port == last {
			time.Sleep(time.Second)
		}
		last = port
		err := start(port)
		if err == nil {
			return port
		}
		if !errors.Is(err, errPortTaken) || attempt == 5 {
			t.Fatalf("%v", err)
		}
		t.Logf("%v; trying again", err)
	}
}

func logOf(p *Process) string {
	if p == nil {
		return "(none)"
	}
	return p.LogPath
}

// RequireProcesses skips in -short mode: outside processes do not run there.
func RequireProcesses(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("runs real processes; skipped in -short mode")
	}
}
