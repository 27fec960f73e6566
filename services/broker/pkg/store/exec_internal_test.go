package store

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// A script Redis has not seen (flushed, or a new server) is loaded and
// its calls resent; one that does not compile fails its calls with Lua's
// reason, while the good calls in the same batch still run.
func TestScriptsAreLoadedAndALuaErrorIsReported(t *testing.T) {
	r := proc.StartRedis(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s := New(rdb, DefaultPrefix)
	ctx := context.Background()
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	bad := &call{sc: redis.NewScript("return (")}
	good := &call{sc: getScript, args: []any{NewLeaseID()}}
	s.exec(ctx, []*call{bad, good})
	require.Error(t, bad.cmd.Err())
	assert.NotContains(t, bad.cmd.Err().Error(), "NOSCRIPT")
	assert.Contains(t, bad.cmd.Err().Error(), "compil")
	res, err := good.cmd.Slice()
	require.NoError(t, err, "the good call was loaded and resent")
	assert.Empty(t, res, "no such lease")
}

// Concurrent calls of a batched script go to Redis as one script call,
// and each is decided as if alone: within one batch, leases see those
// granted before them (no proxy passes its cap), and each call gets its
// own reply.
func TestABatchIsOneScriptCallAndEachCallItsOwnDecision(t *testing.T) {
	r := proc.StartRedis(t, false)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	s := New(rdb, DefaultPrefix)
	ctx := context.Background()
	require.NoError(t, s.Join(ctx, `{}`, []Member{{UID: "a", Namespace: "ns", Addr: "127.0.0.1:3001"}, {UID: "b", Namespace: "ns", Addr: "127.0.0.1:3002"}}, []string{"ix"}))
	acquire := func() *call {
		// index, target, cap 1, ttl, lease id, random, no request id,
		// fingerprint, target cap, session, per target, caller, caller cap
		return &call{sc: acquireScript, args: []any{"ix", "", 1, 60000, NewLeaseID(), 7, "", "", 0, "", "0", "", 0, 0}}
	}
	calls := []*call{acquire(), acquire(), {sc: releaseScript, args: []any{NewLeaseID(), ""}}, acquire()}
	evalshas := func() int64 {
		stats, err := rdb.Info(ctx, "commandstats").Result()
		require.NoError(t, err)
		var n int64
		for line := range strings.Lines(stats) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, err = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				require.NoError(t, err)
			}
		}
		return n
	}
	// Redis loads the scripts (a first call of each is refused NOSCRIPT).
	s.exec(ctx, []*call{{sc: acquireScript, args: []any{"nix", "", 1, 60000, NewLeaseID(), 7, "", "", 0, "", "0", "", 0, 0}}, {sc: releaseScript, args: []any{NewLeaseID(), ""}}})
	before := evalshas()
	s.exec(ctx, calls)
	assert.Equal(t, int64(2), evalshas()-before, "three acquires and a release: one script call each")

	var leased []string
	for _, c := range []*call{calls[0], calls[1]} {
		res, err := c.cmd.Slice()
		require.NoError(t, err)
		require.Equal(t, "ok", res[0])
		leased = append(leased, res[1].(string))
	}
	assert.ElementsMatch(t, []string{"a", "b"}, leased, "the second lease saw the first")
	res, err := calls[3].cmd.Slice()
	require.NoError(t, err)
	assert.Equal(t, []any{"none", int64(2), int64(0), int64(2)}, res, "both proxies at the cap of 1")
	released, err := calls[2].cmd.Int64()
	require.NoError(t, err)
	assert.Zero(t, released, "no such lease")
}
