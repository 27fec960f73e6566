package broker

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// After a run of every API call, each key in Redis is one schema.go
// declares, of the type it declares, and has a TTL unless it is declared
// permanent: the layout has one description, and it is the true one.
func TestEveryKeyIsDeclared(t *testing.T) {
	f := newFleet(t)
	for i := range 4 {
		f.add(fmt.Sprintf("p%d", i), fmt.Sprintf("127.0.7.%d", 10+i), map[string]string{"pool": "k"})
	}
	// Two proxies behind one exit IP share their cooldowns.
	f.addBehind("a", "127.0.7.1", "198.51.100.1")
	f.addBehind("b", "127.0.7.2", "198.51.100.1")
	r := proc.StartRedis(t, false)
	b := startBroker(t, f, r, "--quarantine-targets", "2", "--cooldown", "1h")
	b.WaitListed(6)

	require.Equal(t, 200, b.Do("GET", "/v1/proxies?pool=k&target=shop.example", "").Status)
	const shop = `{"selector":{"pool":"k"},"target":"shop.example"`
	held, _ := b.LeaseFor(shop + `,"requestId":"r-1","sessionKey":"s-1","ttlSeconds":30}`)
	require.Equal(t, 200, b.Do("POST", "/v1/leases/"+held+"/renew", `{"ttlSeconds":60}`).Status)
	b.Report(held, `{"result":"ok"}`)
	var ids []string
	for range 3 {
		id, _ := b.LeaseFor(shop + `}`)
		ids = append(ids, id)
	}
	assert.Equal(t, []string{"COOLDOWN_STARTED"}, actions(b.Report(ids[0], `{"result":"rate_limited","statusCode":429}`)))
	assert.Equal(t, []string{"COOLDOWN_STARTED"}, actions(b.Report(ids[1], `{"result":"rate_limited","statusCode":429}`)))
	assert.Contains(t, actions(b.Report(ids[2], `{"result":"rate_limited","statusCode":429}`)), "PACING_STARTED")
	rep := b.Do("POST", "/v1/sessions/s-1/report", `{"result":"blocked","target":"shop.example","statusCode":403}`)
	require.Equal(t, 200, rep.Status, string(rep.Body))

	// A shared cooldown, then a refusal: the only match cools down.
	behind, _ := b.LeaseFor(`{"selector":{"n":"a"},"target":"news.example"}`)
	assert.Equal(t, []string{"COOLDOWN_STARTED"}, actions(b.Report(behind, `{"result":"rate_limited"}`)))
	assert.Equal(t, 429, b.Lease(`{"selector":{"n":"a"},"target":"news.example"}`).Status)
	refusals := b.Do("GET", "/v1/refusals", "")
	require.Equal(t, 200, refusals.Status, string(refusals.Body))

	// Errors on two targets quarantine b.
	for _, target := range []string{"x.example", "y.example"} {
		id, _ := b.LeaseFor(`{"selector":{"n":"b"},"target":"` + target + `"}`)
		b.Report(id, `{"result":"error"}`)
	}
	for _, id := range append(ids, held, behind) {
		require.Equal(t, 204, b.Do("DELETE", "/v1/leases/"+id, "").Status)
	}
	// One lease stays live, with a request id and an error report.
	live, liveProxy := b.LeaseFor(`{"selector":{"pool":"k"},"target":"z.example","requestId":"r-2"}`)
	assert.Equal(t, []string{"NONE"}, actions(b.Report(live, `{"result":"error"}`)))
	// A Proxy deleted leaves the store; not the live lease's, whose
	// deletion would end that lease and take its keys with it.
	goneName := "p3"
	if liveProxy == f.ns+"/p3" {
		goneName = "p2"
	}
	var gone v1.Proxy
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: goneName}, &gone))
	require.NoError(t, env.Client.Delete(context.Background(), &gone))
	b.WaitListed(5)

	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer rdb.Close()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, k := range keys {
		decl, ok := store.Match(store.DefaultPrefix, k)
		if !assert.True(t, ok, "%s is not declared in schema.go", k) {
			continue
		}
		seen[decl.Name] = true
		typ, err := rdb.Type(ctx, k).Result()
		require.NoError(t, err)
		assert.Equal(t, decl.Type, typ, "%s", k)
		ttl, err := rdb.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if decl.Permanent == "" {
			assert.Positive(t, ttl, "%s is declared to expire (%s) and has no TTL", k, decl.Expires)
		}
	}
	for _, want := range []store.Key{store.KeyRequest, store.KeyCooldown, store.KeyCoolingIndex, store.KeyTarget, store.KeySession, store.KeyErrors, store.KeyRejoin, store.KeyRefused} {
		assert.True(t, seen[want.Name], "the run left no %s key: it did not exercise what it should", want.Pattern)
	}
}
