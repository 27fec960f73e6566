package store

import (
	"context"
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
	bad := &call{ctx: ctx, sc: redis.NewScript("return (")}
	good := &call{ctx: ctx, sc: getScript, args: []any{NewLeaseID()}}
	s.exec(ctx, []*call{bad, good})
	require.Error(t, bad.cmd.Err())
	assert.NotContains(t, bad.cmd.Err().Error(), "NOSCRIPT")
	assert.Contains(t, bad.cmd.Err().Error(), "compil")
	res, err := good.cmd.Slice()
	require.NoError(t, err, "the good call was loaded and resent")
	assert.Empty(t, res, "no such lease")
}
