package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Check reports whether one dependency is ready; nil means ready.
type Check func(context.Context) error

// Ops is the operations endpoint of a service: /healthz (the process is
// alive), /readyz (every readiness check passes) and /metrics.
type Ops struct {
	// Registry holds the service's metrics; Go and process collectors are
	// added by NewOps.
	Registry *prometheus.Registry

	mu     sync.Mutex
	checks map[string]Check
}

// NewOps returns an Ops with a fresh registry.
func NewOps() *Ops {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &Ops{Registry: reg, checks: map[string]Check{}}
}

// AddReadyCheck adds a named readiness check.
func (o *Ops) AddReadyCheck(name string, c Check) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.checks[name] = c
}

// Handler serves the three endpoints.
func (o *Ops) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		o.mu.Lock()
		checks := make(map[string]Check, len(o.checks))
		for k, v := range o.checks {
			checks[k] = v
		}
		o.mu.Unlock()
		for name, c := range checks {
			if err := c(ctx); err != nil {
				http.Error(w, fmt.Sprintf("%s: %v", name, err), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{Registry: o.Registry}))
	return mux
}

// Serve runs h on addr, within limits, until ctx ends, then shuts it down
// gracefully.
// The listener is bound before Serve returns to its caller's goroutine
// scheduling, so a bad address fails at once.
func Serve(ctx context.Context, log *slog.Logger, name, addr string, h http.Handler, limits Limits) (func() error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: listening on %s: %w", name, addr, err)
	}
	srv := limits.HTTPServer(h)
	errc := make(chan error, 1)
	go func() {
		log.Info("serving", "server", name, "addr", ln.Addr().String())
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("%s: %w", name, err)
		}
		close(errc)
	}()
	wait := func() error {
		select {
		case err, ok := <-errc:
			if ok {
				return err
			}
			return nil
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("%s: shutdown: %w", name, err)
		}
		return <-errc
	}
	return wait, nil
}

// Pprof is Go's /debug/pprof profiles, for --pprof-bind-address.
func Pprof() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}
