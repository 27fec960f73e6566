// Package filewatch follows files mounted from Secrets: the project's
// tokens and certificates are re-read on a timer, so a rotated Secret
// takes effect without a restart. A timer, not inotify: a mounted Secret
// changes through a symlink swap that file watches report unreliably, and
// the readers compare content, not modification times.
package filewatch

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"
)

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

// Content is a file's content, trimmed of surrounding white space, as last
// read: a password from a mounted Secret.
type Content struct {
	mu sync.RWMutex
	v  string
}

// Value is the content as last read.
func (c *Content) Value() string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.v
}

// FollowContent reads path, which must not be empty, and re-reads it every
// interval until ctx ends.
func FollowContent(ctx context.Context, log *slog.Logger, interval time.Duration, what, path string) (*Content, error) {
	read := func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("%s is empty", path)
		}
		return v, nil
	}
	v, err := read()
	if err != nil {
		return nil, err
	}
	c := &Content{v: v}
	Follow(ctx, log, interval, what, path, func() (bool, error) {
		v, err := read()
		if err != nil {
			return false, err
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		changed := v != c.v
		c.v = v
		return changed, nil
	})
	return c, nil
}
