package store

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed lib.lua
	libSrc string
	//go:embed acquire.lua
	acquireSrc string
	//go:embed renew.lua
	renewSrc string
	//go:embed release.lua
	releaseSrc string
	//go:embed get.lua
	getSrc string
	//go:embed report.lua
	reportSrc string
	//go:embed join.lua
	joinSrc string
	//go:embed leave.lua
	leaveSrc string
	//go:embed drop.lua
	dropSrc string
	//go:embed loads.lua
	loadsSrc string

	acquireScript = batched(grows, 14, acquireSrc)
	renewScript   = script(shrinks, renewSrc)
	releaseScript = batched(shrinks, 2, releaseSrc)
	getScript     = script(reads, getSrc)
	reportScript  = script(grows, reportSrc)
	joinScript    = script(grows, joinSrc)
	leaveScript   = script(shrinks, leaveSrc)
	dropScript    = script(shrinks, dropSrc)
	loadsScript   = script(shrinks, loadsSrc) // applies what is due first
)

// A script's flags (Redis 7's shebang). Out of memory (maxmemory with
// noeviction), Redis refuses a script that grows the data set before it
// runs; without flags it would refuse only a first write that grows, and
// let one past the limit that first deleted something (an expiry). Those
// that end leases run in any case: they are how memory comes back.
const (
	grows   = "#!lua"
	shrinks = "#!lua flags=allow-oom"
	reads   = "#!lua flags=no-writes"
)

func script(flags, body string) *redis.Script {
	return redis.NewScript(flags + "\n" + luaKeys + libSrc + "\n" + body)
}

// arity is how many arguments one call of each batched script takes.
var arity = map[*redis.Script]int{}

// batched builds a script from a body that defines one(...), the work of
// one call, so that concurrent calls go to Redis as one: the script takes
// the arguments of any number of calls, n each, decides each in turn as
// if alone, and answers the list of their replies. A script call costs
// Redis about as much again as an acquire's own work (the prelude, the
// clock, the drain of what is due, the call itself); the calls of a batch
// share one. Its body reads the clock as NOW, and MORE says whether more
// was due than one drain applies.
func batched(flags string, n int, body string) *redis.Script {
	sc := script(flags, "local NOW = now_ms()\nlocal MORE = drain(NOW, DRAIN)\n"+body+fmt.Sprintf(`
local out = {}
for i = 1, #ARGV, %d do
  out[#out + 1] = one(unpack(ARGV, i, i + %d))
end
return out`, n, n-1))
	arity[sc] = n
	return sc
}

// call is one script call waiting for a pipeline.
type call struct {
	sc   *redis.Script
	args []any
	cmd  *redis.Cmd
	done chan struct{}
}

// Pipeline sends concurrent script calls together until ctx ends: each
// sender takes every call waiting and makes one round trip of them, so
// with many leases in flight Redis and the broker make two system calls
// per batch instead of per call (on a loaded machine, a fifth of the
// CPU a lease costs). A lone call goes at once, as before. Every script
// is idempotent, so go-redis retrying a whole pipeline is safe.
func (s *Store) Pipeline(ctx context.Context, senders int) {
	s.calls = make(chan *call)
	for range senders {
		go s.send(ctx)
	}
}

// maxBatch bounds one round trip.
const maxBatch = 64

func (s *Store) send(ctx context.Context) {
	batch := make([]*call, 0, maxBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-s.calls:
			batch = append(batch[:0], c)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case c := <-s.calls:
				batch = append(batch, c)
			default:
				break more
			}
		}
		s.exec(context.WithoutCancel(ctx), batch)
		for _, c := range batch {
			close(c.done)
		}
	}
}

// readOnly are the scripts whose effects need not reach a replica: a
// lost drain is applied again from the replica's own due set.
func readOnly(sc *redis.Script) bool {
	return sc == getScript || sc == loadsScript || sc == inspectScript
}

// exec makes one round trip of a batch of script calls, setting each
// call's cmd. A script the server has not seen (a new, restarted or
// promoted Redis) is loaded and its calls sent again. With Wait, the
// batch ends with one WAIT that covers every write in it (WAIT counts
// the writes made on its own connection, so it goes down the same
// pipeline, to the node that owns the keys).
func (s *Store) exec(ctx context.Context, batch []*call) {
	wait := false
	for _, c := range batch {
		wait = wait || (s.Wait.Replicas > 0 && !readOnly(c.sc))
	}
	var node redis.Cmdable = s.rdb
	cluster, isCluster := s.rdb.(*redis.ClusterClient)
	if wait && isCluster {
		m, err := cluster.MasterForKey(ctx, s.route[0])
		if err != nil {
			for _, c := range batch {
				c.cmd = failed(ctx, err)
			}
			return
		}
		node = m
	}
	pending := batch
	for try := 0; try < 2 && len(pending) > 0; try++ {
		var acked *redis.Cmd
		sends := merge(pending)
		_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, m := range sends {
				m.cmd = m.sc.EvalSha(ctx, p, s.route, m.args...)
			}
			if wait {
				acked = p.Do(ctx, "WAIT", s.Wait.Replicas, s.Wait.Timeout.Milliseconds())
			}
			return nil
		})
		if err != nil && wait && isCluster {
			// Talking to the node directly bypasses the Cluster client's
			// own reaction to a dead node or a moved slot: have it relearn
			// the slots, so the next call finds the new owner.
			cluster.ReloadState(ctx)
		}
		for _, m := range sends {
			m.split(ctx)
		}
		var missing []*call
		for _, c := range pending {
			switch {
			case redis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT"):
				missing = append(missing, c)
			case wait && c.cmd.Err() == nil && !readOnly(c.sc):
				s.checkAcked(ctx, c, acked)
			}
		}
		pending = nil // not pending[:0]: on the first try it is the caller's batch
		for _, c := range missing {
			// A script that does not load (a Lua error) fails its calls
			// with the reason, not with the resent call's NOSCRIPT.
			if err := c.sc.Load(ctx, node).Err(); err != nil {
				c.cmd = failed(ctx, err)
				continue
			}
			pending = append(pending, c)
		}
	}
}

// sent is one script call on the wire: a call alone, or the calls of a
// batched script merged into one.
type sent struct {
	sc    *redis.Script
	args  []any
	calls []*call
	cmd   *redis.Cmd
}

// merge turns a batch's calls into script calls, one per batched script.
func merge(calls []*call) []*sent {
	out := make([]*sent, 0, len(calls))
	merged := map[*redis.Script]*sent{}
	for _, c := range calls {
		if _, ok := arity[c.sc]; !ok {
			out = append(out, &sent{sc: c.sc, args: c.args, calls: []*call{c}})
			continue
		}
		if m := merged[c.sc]; m != nil {
			m.args = append(m.args, c.args...)
			m.calls = append(m.calls, c)
			continue
		}
		m := &sent{sc: c.sc, args: append([]any(nil), c.args...), calls: []*call{c}}
		merged[c.sc] = m
		out = append(out, m)
	}
	return out
}

// split gives each call its reply: a merged call's list is one reply
// per call, and its error (NOSCRIPT among them) is every call's.
func (m *sent) split(ctx context.Context) {
	if _, ok := arity[m.sc]; !ok {
		m.calls[0].cmd = m.cmd
		return
	}
	replies, err := m.cmd.Slice()
	if err == nil && len(replies) != len(m.calls) {
		err = fmt.Errorf("a batched script answered %d replies to %d calls", len(replies), len(m.calls))
	}
	for i, c := range m.calls {
		c.cmd = redis.NewCmd(ctx)
		if err != nil {
			c.cmd.SetErr(err)
		} else {
			c.cmd.SetVal(replies[i])
		}
	}
}

// checkAcked fails a write fewer replicas than Wait.Replicas acknowledged:
// Redis applied it, but it may not outlive a failover, so say so rather
// than answer as if it were safe. Every write is idempotent (lease id,
// request id), so the caller's retry is harmless.
func (s *Store) checkAcked(ctx context.Context, c *call, acked *redis.Cmd) {
	n, err := acked.Int64()
	if err == nil && n >= int64(s.Wait.Replicas) {
		return
	}
	waitShortfalls.Inc()
	c.cmd = failed(ctx, fmt.Errorf("%d of %d replicas acknowledged the change within %s (%v); retry with the same requestId", n, s.Wait.Replicas, s.Wait.Timeout, err))
}

func wrap(err error) error {
	if err == nil || errors.Is(err, redis.Nil) {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	switch {
	case redis.HasErrorPrefix(err, "EPOWNER"):
		return ErrNotOwner
	case redis.HasErrorPrefix(err, "EPTARGET"):
		return &WrongTargetError{Leased: strings.TrimPrefix(err.Error(), "EPTARGET ")}
	case redis.HasErrorPrefix(err, "OOM"):
		return fmt.Errorf("%w (%v)", ErrFull, err)
	}
	return &UnavailableError{err}
}

func (s *Store) run(ctx context.Context, sc *redis.Script, args ...any) *redis.Cmd {
	c := &call{sc: sc, args: args, done: make(chan struct{})}
	if s.calls == nil {
		s.exec(ctx, []*call{c})
		return c.cmd
	}
	select {
	case s.calls <- c:
	case <-ctx.Done():
		return failed(ctx, ctx.Err())
	}
	select {
	case <-c.done:
		return c.cmd
	case <-ctx.Done():
		return failed(ctx, ctx.Err())
	}
}

func failed(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
