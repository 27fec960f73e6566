package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// traffic leases and releases through st from several goroutines, as a
// fleet of crawlers would, and remembers what Redis acknowledged.
type traffic struct {
	st       *store.Store
	members  []store.Member
	mu       sync.Mutex
	live     map[string]bool // acknowledged, not released
	released []string        // acknowledged releases
	granted  atomic.Int64
	failed   atomic.Int64
	lastOK   atomic.Int64 // unix nanos of the last grant
	firstErr atomic.Int64 // unix nanos of the first failure
	lastErr  atomic.Int64
	errMsg   atomic.Value
	stop     chan struct{}
	wg       sync.WaitGroup
}

func startTraffic(t *testing.T, st *store.Store, n int) *traffic {
	tr := &traffic{st: st, live: map[string]bool{}, stop: make(chan struct{})}
	for i := range n {
		tr.members = append(tr.members, store.Member{UID: fmt.Sprintf("uid-%03d", i), Namespace: "ns", Addr: "127.0.0.1:3128"})
	}
	require.NoError(t, st.Join(context.Background(), `{"ha":true}`, tr.members, []string{"ha"}))
	for w := range 8 {
		tr.wg.Add(1)
		go tr.worker(uint64(w))
	}
	return tr
}

func (tr *traffic) worker(seed uint64) {
	defer tr.wg.Done()
	rng := rand.New(rand.NewPCG(seed, 7))
	for {
		select {
		case <-tr.stop:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := tr.step(ctx, rng)
		cancel()
		now := time.Now().UnixNano()
		if err != nil {
			tr.failed.Add(1)
			tr.firstErr.CompareAndSwap(0, now)
			tr.lastErr.Store(now)
			tr.errMsg.Store(err.Error())
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (tr *traffic) step(ctx context.Context, rng *rand.Rand) error {
	if rng.IntN(2) == 0 {
		tr.mu.Lock()
		var id string
		for id = range tr.live {
			break
		}
		tr.mu.Unlock()
		if id != "" {
			if _, err := tr.st.Release(ctx, id, ""); err != nil {
				// Unavailable says nothing of whether Redis applied it:
				// the lease is neither counted live nor released.
				tr.mu.Lock()
				delete(tr.live, id)
				tr.mu.Unlock()
				return err
			}
			tr.mu.Lock()
			delete(tr.live, id)
			tr.released = append(tr.released, id)
			tr.mu.Unlock()
			return nil
		}
	}
	l, err := tr.st.Acquire(ctx, store.Acquire{Index: "ha", TTL: time.Hour, LeaseID: store.NewLeaseID()})
	if errors.Is(err, store.ErrNoIndex) {
		// The new primary never got the index: rebuild it, as the broker does.
		return tr.st.Join(ctx, `{"ha":true}`, tr.members, []string{"ha"})
	}
	if err != nil {
		return err
	}
	tr.mu.Lock()
	tr.live[l.ID] = true
	tr.mu.Unlock()
	tr.granted.Add(1)
	tr.lastOK.Store(time.Now().UnixNano())
	return nil
}

// grantsAfter waits until a lease is granted after at.
func (tr *traffic) grantsAfter(t *testing.T, at time.Time, within time.Duration) {
	t.Helper()
	for end := time.Now().Add(within); tr.lastOK.Load() <= at.UnixNano(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no lease granted within %s of the failover; %d calls failed, the last with: %v", within, tr.failed.Load(), tr.errMsg.Load())
		}
	}
}

// finish stops the traffic and counts acknowledged leases the store lost
// and acknowledged releases it forgot (a released lease live again).
func (tr *traffic) finish(t *testing.T) (lost, resurrected, acked int, outage time.Duration) {
	close(tr.stop)
	tr.wg.Wait()
	ctx := context.Background()
	for id := range tr.live {
		if _, err := tr.st.Get(ctx, id); errors.Is(err, store.ErrLeaseNotFound) {
			lost++
		} else {
			require.NoError(t, err)
		}
	}
	for _, id := range tr.released {
		if _, err := tr.st.Get(ctx, id); err == nil {
			resurrected++
		}
	}
	if f := tr.firstErr.Load(); f != 0 {
		outage = time.Duration(tr.lastErr.Load() - f)
	}
	return lost, resurrected, len(tr.live) + len(tr.released), outage
}

// TestSentinelFailoverUnderTraffic kills the primary of a real Sentinel
// set-up (primary, replica, three sentinels) while brokers lease: leasing
// resumes on the promoted replica with no restart. Replication is
// asynchronous, so a lease acknowledged just before the kill may be lost;
// with Wait (Redis WAIT for one replica) none is.
func TestSentinelFailoverUnderTraffic(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait store.Wait
	}{
		{"async", store.Wait{}},
		{"wait for a replica", store.Wait{Replicas: 1, Timeout: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := proc.StartRedis(t, false)
			replica := proc.StartRedis(t, false, "--replicaof", "127.0.0.1", fmt.Sprint(primary.Port))
			sentinels := proc.StartSentinels(t, "ep", primary.Addr, 3)
			rdb := redis.NewUniversalClient(store.ClientOptions(sentinels, "ep"))
			defer func() { _ = rdb.Close() }()
			waitReplicated(t, primary.Addr, 1)
			lost, resurrected := failover(t, tc.name, rdb, store.DefaultPrefix, tc.wait, primary, replica)
			if tc.wait.Replicas > 0 {
				assert.Zero(t, lost, "a lease a replica acknowledged survives the failover")
				assert.Zero(t, resurrected)
			}
		})
	}
}

// failover leases through a store on rdb under traffic, kills primary,
// waits for replica's promotion and brings primary back (as a restarted pod
// would; with Wait, leasing needs a replica again), then waits for leases
// to flow and counts what the failover lost.
func failover(t *testing.T, name string, rdb redis.UniversalClient, prefix string, wait store.Wait, primary, replica *proc.Redis) (lost, resurrected int) {
	st := store.New(rdb, prefix)
	st.Wait = wait
	st.Pipeline(t.Context(), 2)
	tr := startTraffic(t, st, 50)
	require.Eventually(t, func() bool { return tr.granted.Load() > 200 }, 20*time.Second, 20*time.Millisecond)
	primary.Kill()
	killed := time.Now()
	waitPromoted(t, replica.Addr)
	primary.Start()
	tr.grantsAfter(t, killed.Add(time.Second), 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	lost, resurrected, acked, outage := tr.finish(t)
	t.Logf("%s: %d lease changes acknowledged, %d leases granted; after the failover %d acknowledged leases lost, %d released leases live again; leasing failed for %s (replica %s promoted)",
		name, acked, tr.granted.Load(), lost, resurrected, outage.Round(time.Millisecond), replica.Addr)
	return lost, resurrected
}

func waitPromoted(t *testing.T, replica string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: replica})
	defer func() { _ = c.Close() }()
	require.Eventually(t, func() bool {
		info, _ := c.Info(context.Background(), "replication").Result()
		return strings.Contains(info, "role:master")
	}, 30*time.Second, 50*time.Millisecond, "the replica was never promoted")
}

func waitReplicated(t *testing.T, primary string, replicas int) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: primary})
	defer func() { _ = c.Close() }()
	require.Eventually(t, func() bool {
		info, _ := c.Info(context.Background(), "replication").Result()
		return strings.Contains(info, fmt.Sprintf("connected_slaves:%d", replicas)) && strings.Contains(info, "state=online")
	}, 20*time.Second, 50*time.Millisecond)
}

// startCluster starts a Redis Cluster of three primaries sharing the
// slots, plus a replica of the primary that owns the slot of tag.
func startCluster(t *testing.T, tag string) (nodes []*proc.Redis, owner, replica *proc.Redis) {
	args := []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "1000"}
	ctx := context.Background()
	client := func(r *proc.Redis) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: r.Addr})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	for i := range 3 {
		r := proc.StartRedis(t, true, args...)
		nodes = append(nodes, r)
		lo, hi := i*16384/3, (i+1)*16384/3-1
		require.NoError(t, client(r).Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err())
	}
	first := client(nodes[0])
	for _, r := range nodes[1:] {
		require.NoError(t, first.ClusterMeet(ctx, "127.0.0.1", fmt.Sprint(r.Port)).Err())
	}
	slot, err := first.ClusterKeySlot(ctx, tag).Result()
	require.NoError(t, err)
	owner = nodes[slot*3/16384]
	ownerID, err := client(owner).ClusterMyID(ctx).Result()
	require.NoError(t, err)
	replica = proc.StartRedis(t, true, args...)
	rc := client(replica)
	require.NoError(t, rc.ClusterMeet(ctx, "127.0.0.1", fmt.Sprint(owner.Port)).Err())
	require.Eventually(t, func() bool { return rc.ClusterReplicate(ctx, ownerID).Err() == nil }, 20*time.Second, 100*time.Millisecond)
	for _, r := range append(nodes, replica) {
		c := client(r)
		require.Eventually(t, func() bool {
			info, _ := c.ClusterInfo(ctx).Result()
			return strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:4")
		}, 30*time.Second, 100*time.Millisecond)
	}
	waitReplicated(t, owner.Addr, 1)
	return nodes, owner, replica
}

// TestClusterFailoverUnderTraffic runs the store on a real three-shard
// Redis Cluster. Every key of one prefix shares a hash tag, so one shard
// holds them: the test kills that shard's primary under traffic, its
// replica takes over, and the Cluster client follows with no restart.
// With Wait no acknowledged lease is lost. A second prefix (another
// broker's, say another namespace's) lands on another shard: that is how
// lease state spreads its writes across a Cluster.
func TestClusterFailoverUnderTraffic(t *testing.T) {
	nodes, owner, replica := startCluster(t, "{ep}")
	var addrs []string
	for _, r := range nodes {
		addrs = append(addrs, r.Addr)
	}
	rdb := redis.NewUniversalClient(store.ClientOptions(addrs, ""))
	defer func() { _ = rdb.Close() }()
	cc := rdb.(*redis.ClusterClient)
	ctx := context.Background()

	// A prefix whose tag hashes to another shard.
	other := ""
	for i := 0; other == ""; i++ {
		if p := fmt.Sprintf("{ep:%d}:", i); shardOf(t, cc, p) != shardOf(t, cc, store.DefaultPrefix) {
			other = p
		}
	}
	require.NotEqual(t, shardOf(t, cc, store.DefaultPrefix), shardOf(t, cc, other), "the two prefixes live on different shards")
	st2 := store.New(rdb, other)
	require.NoError(t, st2.Join(ctx, "{}", []store.Member{{UID: "x", Namespace: "b", Addr: "127.0.0.1:1"}}, []string{"b"}))
	l, err := st2.Acquire(ctx, store.Acquire{Index: "b", TTL: time.Hour, LeaseID: store.NewLeaseID()})
	require.NoError(t, err)
	assert.Equal(t, "x", l.Proxy)

	lost, resurrected := failover(t, "cluster", rdb, store.DefaultPrefix, store.Wait{Replicas: 1, Timeout: time.Second}, owner, replica)
	assert.Zero(t, lost)
	assert.Zero(t, resurrected)
	assert.Equal(t, replica.Addr, shardOf(t, cc, store.DefaultPrefix), "the replica now serves the slot")
}

func shardOf(t *testing.T, cc *redis.ClusterClient, prefix string) string {
	t.Helper()
	c, err := cc.MasterForKey(context.Background(), prefix+"exp")
	require.NoError(t, err)
	return c.Options().Addr
}

// TestRedisCrashUnderTraffic kills Redis with SIGKILL while brokers lease
// and restarts it from its append-only file, as a restarted pod would. With
// every write fsynced (appendfsync always, the chart's redis.durability:
// always) no acknowledged lease is lost; with the default (fsync every
// second) the test prints what was lost, so the trade-off is visible.
func TestRedisCrashUnderTraffic(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fsync string
	}{
		{"fsync every second (default)", "everysec"},
		{"fsync always", "always"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := proc.StartRedis(t, false, "--appendonly", "yes", "--appendfsync", tc.fsync)
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
			defer func() { _ = rdb.Close() }()
			st := store.New(rdb, store.DefaultPrefix)
			st.Pipeline(t.Context(), 2)
			tr := startTraffic(t, st, 50)
			require.Eventually(t, func() bool { return tr.granted.Load() > 2000 }, 30*time.Second, 10*time.Millisecond)
			r.Kill()
			killed := time.Now()
			r.Start()
			tr.grantsAfter(t, killed.Add(100*time.Millisecond), 30*time.Second)
			lost, resurrected, acked, outage := tr.finish(t)
			t.Logf("%s: %d lease changes acknowledged; after kill -9 and a restart from the AOF %d acknowledged leases lost, %d released leases live again; leasing failed for %s",
				tc.name, acked, lost, resurrected, outage.Round(time.Millisecond))
			if tc.fsync == "always" {
				assert.Zero(t, lost, "an acknowledged lease survives the crash")
				assert.Zero(t, resurrected, "an acknowledged release survives the crash")
			}
		})
	}
}
