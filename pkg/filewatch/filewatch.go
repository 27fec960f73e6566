// Package filewatch follows files mounted from Secrets: the project's
// tokens and certificates are re-read on a timer, so a rotated Secret
// takes effect without a restart. A timer, not inotify: a mounted Secret
// changes through a symlink swap that file watches report unreliably, and
// the readers compare content, not modification times.
package filewatch

import (
	"bytes"
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Interval is how often the project's services re-read a mounted Secret:
// a rotation takes effect within it.
const Interval = 5 * time.Second

// Follow calls reload every interval until ctx ends, in a goroutine of
// its own. reload says whether what it read differs from what is in use;
// a failed reload keeps what is in use, and says so in the log under
// what (e.g. "token file", "TLS certificate") and path.
func Follow(ctx context.Context, log *slog.Logger, interval time.Duration, what, path string, reload func() (changed bool, err error)) {
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				changed, err := reload()
				switch {
				case err != nil:
					log.Warn(what+" unreadable; keeping the previous one", "path", path, "err", err)
				case changed:
					log.Info(what+" reloaded", "path", path)
				}
			}
		}
	}()
}

// File is a file's content, trimmed of surrounding white space and
// parsed, as last read: a password or a token list from a mounted Secret.
type File[T any] struct {
	mu  sync.RWMutex
	raw []byte
	v   T
}

// Value is the content as last read.
func (f *File[T]) Value() T {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.v
}

// FollowFile reads path, which must not be empty, parses it, and re-reads
// it every interval until ctx ends; a read or a parse that fails (an
// emptied file, a bad line) keeps what is in use, and says so. It compares content, not modification times:
// Kubernetes swaps a mounted Secret through a symlink whose target's mtime
// says nothing reliable. The comparison is constant-time: the content is
// a secret.
func FollowFile[T any](ctx context.Context, log *slog.Logger, interval time.Duration, what, path string, parse func([]byte) (T, error)) (*File[T], error) {
	read := func() ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, path, err)
		}
		if b = bytes.TrimSpace(b); len(b) == 0 {
			return nil, fmt.Errorf("%s %s is empty", what, path)
		}
		return b, nil
	}
	b, err := read()
	if err != nil {
		return nil, err
	}
	v, err := parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	f := &File[T]{raw: b, v: v}
	Follow(ctx, log, interval, what, path, func() (bool, error) {
		b, err := read()
		if err != nil {
			return false, err
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if subtle.ConstantTimeCompare(b, f.raw) == 1 {
			return false, nil
		}
		v, err := parse(b)
		if err != nil {
			return false, fmt.Errorf("%s %s: %w", what, path, err)
		}
		f.raw, f.v = b, v
		return true, nil
	})
	return f, nil
}

// String is the content as it is, for FollowFile.
func String(b []byte) (string, error) { return string(b), nil }
