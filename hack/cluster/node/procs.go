package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// component is one of the node's processes.
type component struct {
	name string
	args []string
	env  []string
}

// start runs a component in a session of its own, so it outlives the
// command that started it, logging to its file; its pid is recorded for
// Down.
func (c Config) start(p component) error {
	if err := os.MkdirAll(c.logs(), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(c.pids(), 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(c.Log(p.name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(filepath.Join(c.Bins, p.args[0]), p.args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append([]string{"PATH=" + c.Bins + ":/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + c.State}, p.env...)
	cmd.Dir = c.State
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	pid := cmd.Process.Pid
	_ = cmd.Process.Release()
	return os.WriteFile(filepath.Join(c.pids(), p.name), []byte(strconv.Itoa(pid)), 0o644)
}

// running says whether the recorded process of a component is alive.
func (c Config) running(name string) bool {
	pid, ok := c.pid(name)
	return ok && alive(pid)
}

func (c Config) pid(name string) (int, bool) {
	b, err := os.ReadFile(filepath.Join(c.pids(), name))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

func alive(pid int) bool {
	// A zombie is not alive; it is only waiting for init.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// stop ends a component: SIGTERM, then SIGKILL after grace.
func (c Config) stop(name string, grace time.Duration) {
	if pid, ok := c.pid(name); ok {
		terminate(pid, grace)
	}
	_ = os.Remove(filepath.Join(c.pids(), name))
}

func terminate(pid int, grace time.Duration) {
	if !alive(pid) {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for alive(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if alive(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 100 && alive(pid); i++ {
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// waitFor polls ok until it holds or timeout passes; the error names what
// was awaited and points at the component's log.
func (c Config) waitFor(ctx context.Context, what, component string, timeout time.Duration, ok func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		}
		if last = ok(); last == nil {
			return nil
		}
		if component != "" && !c.running(component) {
			return fmt.Errorf("%s exited while waiting for %s; the end of its log:\n%s", component, what, c.tail(component, 15))
		}
		time.Sleep(200 * time.Millisecond)
	}
	if last == nil {
		last = errors.New("timed out")
	}
	hint := ""
	if component != "" {
		hint = "; see " + c.Log(component)
	}
	return fmt.Errorf("waiting %s for %s: %w%s", timeout, what, last, hint)
}

// tail is the end of a component's log.
func (c Config) tail(component string, lines int) string {
	b, _ := os.ReadFile(c.Log(component))
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return "  " + strings.Join(all, "\n  ")
}

// SaveLogs copies every component's log to dir, before Down removes them.
func (c Config) SaveLogs(dir string) error {
	entries, err := os.ReadDir(c.logs())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(c.logs(), e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// processesOf lists the processes whose executable is path and, when
// args are given, whose arguments are exactly args: envtest runs the same
// etcd binary, and its processes are not the node's.
func processesOf(path string, args ...string) []int {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil
	}
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || strings.TrimSuffix(exe, " (deleted)") != real {
			continue
		}
		if args != nil {
			cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err != nil {
				continue
			}
			if argv := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00"); !slices.Equal(argv[1:], args) {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}
