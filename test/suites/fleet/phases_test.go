package fleet

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"sync"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/promtext"
)

// lastProbeRe matches the controller's per-proxy last-probe gauge; its
// value is the probe's own time, in seconds with millisecond resolution.
var lastProbeRe = regexp.MustCompile(`^proxy_operator_healthcheck_last_timestamp_seconds\{name="([^"]+)",namespace="` + ns + `"\}$`)

// steps are the milestones of one proxy's bring-up, in order, as seen
// from outside: the apply's create returned, the watch saw it Ready (the
// lifecycle's status write), the controller had its first probe result,
// the watch saw it Ready and Healthy (the verdict's status write, after
// successThreshold probes). External proxies take no finalizer, so there
// is no step for one.
type steps struct {
	mu                              sync.Mutex
	created, ready, probed, healthy map[string]time.Time
}

func newSteps() *steps {
	return &steps{created: map[string]time.Time{}, ready: map[string]time.Time{}, probed: map[string]time.Time{}, healthy: map[string]time.Time{}}
}

// mark records the first time name reached a step.
func (s *steps) mark(step map[string]time.Time, name string, at time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := step[name]; !ok {
		step[name] = at
	}
}

// watchProbes reads the controller's metrics every period until ctx ends
// and marks each proxy's first probe at the probe's own time. A period
// well under the probe interval sees the first probe's time before the
// second overwrites it. Its own cost lands in the bring-up it measures,
// as a Prometheus scrape's would: a quarter of the interval keeps it small.
func (s *steps) watchProbes(ctx context.Context, metricsURL string, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		m, err := promtext.Scrape(nil, metricsURL)
		if err == nil {
			for k, v := range m {
				if g := lastProbeRe.FindStringSubmatch(k); g != nil {
					s.mark(s.probed, g[1], time.UnixMilli(int64(v*1000)))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// lastAt is when the last proxy reached step, from start.
func (s *steps) lastAt(step map[string]time.Time, start time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastLocked(step).Sub(start)
}

func (s *steps) lastLocked(step map[string]time.Time) time.Time {
	var last time.Time
	for _, t := range step {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// report prints one row per step: per proxy, the time from the step
// before (p50 / p99), and when the last proxy reached it, from the
// apply's start.
func (s *steps) report(out io.Writer, start time.Time, interval time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// from nil: from the apply's start.
	row := func(name string, from, to map[string]time.Time, less time.Duration) {
		var ds []time.Duration
		for px, t := range to {
			f, ok := from[px]
			if from == nil {
				f, ok = start, true
			}
			if ok {
				ds = append(ds, t.Sub(f)-less)
			}
		}
		p50, p99 := percentiles(ds)
		_, _ = fmt.Fprintf(out, "  %s\t%s / %s\tlast at %s (%d proxies)\t\n", name, p50.Round(time.Millisecond), p99.Round(time.Millisecond),
			s.lastLocked(to).Sub(start).Round(time.Millisecond), len(to))
	}
	_, _ = fmt.Fprintf(out, "bring-up by step, per proxy: from the step before, p50 / p99\t\t\t\n")
	row("create (from the apply's start: the 32 writers' queue and the call)", nil, s.created, 0)
	row("Ready, seen by a watch (the lifecycle's status write; External: no finalizer)", s.created, s.ready, 0)
	row("first probe result in the controller (assignment, the prober's schedule)", s.ready, s.probed, 0)
	row(fmt.Sprintf("Healthy, seen by a watch, less one interval (%s) for the second probe (the verdict's write)", interval), s.probed, s.healthy, interval)
}
