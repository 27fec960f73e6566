package lifecycle

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	clocktesting "k8s.io/utils/clock/testing"
)

// Resyncs of Ready instances are bounded per provider entry, however many
// proxies want one: 12 proxies asking every 50 ms would make 240 provider
// reads a second, and a budget of 5 a second holds them to that while
// still re-reading every one of them in turn. Time is stepped, so the
// bound is exact.
func TestResyncsOfAFleetStayWithinTheBudget(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r := newResyncs(50*time.Millisecond, 5, clk)
	deferred := testutil.ToFloat64(resyncsDeferred.WithLabelValues("budget"))
	const n = 12
	reads := map[string]int{}
	const window = 4 * time.Second
	for step := time.Duration(0); step <= window; step += 50 * time.Millisecond {
		for i := range n {
			key := fmt.Sprintf("r%02d", i)
			if r.wait(key, "budget") == 0 {
				reads[key]++
			}
		}
		clk.Step(50 * time.Millisecond)
	}
	total := 0
	for _, c := range reads {
		total += c
	}
	// A token bucket of 5/s with a burst of 5 allows 5 + 5×4 in 4 s.
	assert.LessOrEqual(t, total, 5+5*4, "provider reads in %s", window)
	assert.GreaterOrEqual(t, total, 5+5*4-1, "the budget is used, not wasted")
	assert.Len(t, reads, n, "every Ready proxy was re-read within %s", window)
	assert.Greater(t, testutil.ToFloat64(resyncsDeferred.WithLabelValues("budget")), deferred, "the deferral is counted")

	// A proxy told to wait keeps its turn: asked again before it, it
	// waits for the rest of it; at it, it goes.
	r2 := newResyncs(time.Minute, 1, clk)
	assert.Zero(t, r2.wait("a", "one"))
	d := r2.wait("b", "one")
	assert.Equal(t, time.Second, d)
	clk.Step(400 * time.Millisecond)
	assert.Equal(t, 600*time.Millisecond, r2.wait("b", "one"))
	clk.Step(600 * time.Millisecond)
	assert.Zero(t, r2.wait("b", "one"))
}
