package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/telemetry"
)

// Options are a service's flags: every service's app.Options implements
// it, so each main is the same dozen lines.
type Options interface {
	// Register adds the service's flags to fs.
	Register(fs *flag.FlagSet)
	// Validate names the first bad flag, after parsing and before
	// anything starts; it may keep what it parsed for Run.
	Validate() error
}

// Env is what Run hands a service's body.
type Env struct {
	Log *slog.Logger
	// Tracing: an exporter is configured, so instrumentation that only
	// feeds traces is worth its cost.
	Tracing bool
}

// Run is the body of every main: it registers o's flags and --log-level,
// parses them (exit 2 with a message saying what to fix, also when
// o.Validate fails), sets up logging and tracing, cancels the context on
// SIGTERM or SIGINT, and runs body. It returns the process exit code:
// 0 after a clean shutdown, 1 when body fails, 2 when body returns a
// UsageError.
func Run(name, envPrefix string, args []string, stderr io.Writer, o Options, body func(ctx context.Context, env Env) error) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn or error")
	o.Register(fs)
	if err := ParseFlags(fs, envPrefix, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		_, _ = fmt.Fprintf(stderr, "%s: %v\nrun %s --help for the flags\n", name, err, name)
		return 2
	}
	level, err := telemetry.ParseLevel(*logLevel)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: --log-level: %v\n", name, err)
		return 2
	}
	if err := o.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	log := telemetry.NewLogger(os.Stderr, level, name)
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	tracing := telemetry.TracingConfigFromEnv()
	shutdown, err := telemetry.SetupTracing(ctx, name, tracing)
	if err != nil {
		log.Error("tracing setup failed", "err", err)
		return 2
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()

	if err := body(ctx, Env{Log: log, Tracing: tracing.Exporter != telemetry.ExporterNone}); err != nil {
		var ue UsageError
		if errors.As(err, &ue) {
			log.Error("bad configuration", "err", err)
			_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
			return 2
		}
		log.Error("exiting", "err", err)
		return 1
	}
	log.Info("shut down cleanly")
	return 0
}

// UsageError marks an error in flags or config found by the body: Run
// exits 2 and prints it.
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Usagef returns a UsageError.
func Usagef(format string, args ...any) error {
	return UsageError{fmt.Errorf(format, args...)}
}
