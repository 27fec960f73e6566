// Package filewatch follows files mounted from Secrets: the project's
// tokens and certificates are re-read on a timer, so a rotated Secret
// takes effect without a restart. A timer, not inotify: a mounted Secret
// changes through a symlink swap that file watches report unreliably, and
// the readers compare content, not modification times.
package filewatch

import (
	"context"
	"log/slog"
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
