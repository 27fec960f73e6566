package leases

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
)

// A watch that stops reading is ended once it has WatchBacklog batches
// unsent, with a reason, and the others go on.
func TestAWatchThatFallsBehindIsEndedAndTheOthersGoOn(t *testing.T) {
	inv := inventory.New(nil)
	h := newHub(inv, func(_ context.Context, ps []inventory.Proxy) (map[string]*leasev1.Proxy, error) {
		out := map[string]*leasev1.Proxy{}
		for _, p := range ps {
			out[p.UID] = &leasev1.Proxy{Id: p.ID, Healthy: p.Healthy}
		}
		return out, nil
	})
	h.ready = true // as if the inventory had synced, empty
	stuck, _, err := h.subscribe(filter{}, "", access.Limit{})
	require.NoError(t, err)
	reader, _, err := h.subscribe(filter{}, "", access.Limit{})
	require.NoError(t, err)
	for i := range WatchBacklog + 1 {
		inv.Set(inventory.Proxy{UID: "u", ID: "ns/p", Healthy: i%2 == 0})
		require.NoError(t, h.send(context.Background()))
		select {
		case evs := <-reader.events:
			require.Len(t, evs, 1)
			assert.Equal(t, leasev1.ProxyEvent_TYPE_UPSERT, evs[0].GetType(), "batch %d", i)
		default:
			t.Fatalf("batch %d did not reach the reading watch", i)
		}
	}
	unsent := 0
	for range stuck.events {
		unsent++
	}
	assert.Equal(t, WatchBacklog, unsent, "what was queued is still delivered, then the end")
	assert.Equal(t, codes.ResourceExhausted, status.Code(stuck.err))
	assert.Contains(t, stuck.err.Error(), fmt.Sprintf("fell %d batches", WatchBacklog))
	h.mu.Lock()
	_, open := h.watches[reader]
	h.mu.Unlock()
	assert.True(t, open, "the reading watch goes on")
}

// The inventory's event path never waits on a fan-out: a change is
// recorded while the hub holds its lock (as it does for each send to
// every watch), and goes out once the fan-out is done.
func TestAChangeIsRecordedDuringAFanOut(t *testing.T) {
	inv := inventory.New(nil)
	h := newHub(inv, func(_ context.Context, ps []inventory.Proxy) (map[string]*leasev1.Proxy, error) {
		out := map[string]*leasev1.Proxy{}
		for _, p := range ps {
			out[p.UID] = &leasev1.Proxy{Id: p.ID}
		}
		return out, nil
	})
	h.ready = true
	w, _, err := h.subscribe(filter{}, "", access.Limit{})
	require.NoError(t, err)
	h.mu.Lock() // a fan-out in progress
	recorded := make(chan struct{})
	go func() {
		inv.Set(inventory.Proxy{UID: "u", ID: "ns/p"})
		close(recorded)
	}()
	select {
	case <-recorded:
	case <-time.After(10 * time.Second):
		t.Fatal("the inventory's event waited on the hub's lock")
	}
	h.mu.Unlock()
	require.NoError(t, h.send(context.Background()))
	evs := <-w.events
	require.Len(t, evs, 1)
	assert.Equal(t, "ns/p", evs[0].GetProxy().GetId())
}
