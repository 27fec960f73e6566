package system

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
)

// Runner satisfies proc.T outside `go test`, for the commands that bring
// the system up (the demo, the clients' environment): Fatal runs every
// cleanup and exits, pointing at the logs.
type Runner struct {
	Dir      string
	mu       sync.Mutex
	cleanups []func()
	failed   bool
	n        int
}

// NewRunner keeps every process's log and data under dir, emptied first.
func NewRunner(dir string) *Runner {
	abs, _ := filepath.Abs(dir)
	_ = os.RemoveAll(abs)
	_ = os.MkdirAll(abs, 0o755)
	return &Runner{Dir: abs}
}

// StartAPIServer starts the API server and etcd (the envtest binaries),
// stopped with the other cleanups.
func (r *Runner) StartAPIServer() *testenv.Env {
	env, err := testenv.Start()
	if err != nil {
		r.Fatalf("%v", err)
	}
	r.Cleanup(func() { _ = env.Stop() })
	return env
}

func (r *Runner) Helper()                         {}
func (r *Runner) Logf(format string, args ...any) { fmt.Printf("    "+format+"\n", args...) }
func (r *Runner) Failed() bool                    { return r.failed }
func (r *Runner) Cleanup(f func())                { r.mu.Lock(); r.cleanups = append(r.cleanups, f); r.mu.Unlock() }
func (r *Runner) Fatal(args ...any)               { r.Fatalf("%s", fmt.Sprint(args...)) }
func (r *Runner) Fatalf(format string, args ...any) {
	fmt.Printf("\nFAILED: "+format+"\n", args...)
	fmt.Printf("Every process's log is under %s (one file per process; the lines above name them).\n", filepath.Join(r.Dir, "tmp"))
	r.failed = true
	r.Stop()
	os.Exit(1)
}
func (r *Runner) TempDir() string {
	r.mu.Lock()
	r.n++
	d := filepath.Join(r.Dir, "tmp", fmt.Sprintf("%03d", r.n))
	r.mu.Unlock()
	_ = os.MkdirAll(d, 0o755)
	return d
}

// Stop runs the cleanups, last first.
func (r *Runner) Stop() {
	r.mu.Lock()
	cs := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
}
