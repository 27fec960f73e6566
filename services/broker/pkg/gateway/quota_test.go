package gateway

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// dayMeter counts bytes by tenant and UTC day, as the store's tb:<tenant>:<day>
// keys do.
type dayMeter map[string]int64

func (m dayMeter) key(tenant string, now time.Time) string {
	return tenant + ":" + now.UTC().Format(time.DateOnly)
}

func (m dayMeter) AddTenantBytes(_ context.Context, tenant string, n int64, now time.Time) (int64, error) {
	m[m.key(tenant, now)] += n
	return m[m.key(tenant, now)], nil
}

func (m dayMeter) TenantBytes(_ context.Context, tenant string, now time.Time) (int64, error) {
	return m[m.key(tenant, now)], nil
}

// The byte quota's day is the injected clock's: a tenant at its quota ten
// seconds before UTC midnight is told to come back in ten seconds, and is
// let through once the clock passes midnight; what a tunnel carries is
// counted against the clock's day.
func TestTheByteQuotaFollowsTheInjectedClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 7, 23, 59, 50, 0, time.UTC))
	m := dayMeter{}
	g := &Gateway{o: Options{Meter: m, Clock: clk, DialTimeout: time.Second}}
	team := &access.Tenant{Name: "team", Quotas: access.Quotas{GatewayBytesPerDay: 100}}

	_, ok := g.withinBytes(team)
	assert.True(t, ok, "nothing carried today")
	meter := g.byteMeter(team)
	meter.add(100)
	meter.flush()
	a, ok := g.withinBytes(team)
	assert.False(t, ok, "the day's quota is reached")
	assert.Equal(t, "TENANT_BYTES_QUOTA", a.reason)
	assert.Equal(t, 10*time.Second, a.retryAfter, "until the clock's midnight")

	clk.Step(11 * time.Second)
	_, ok = g.withinBytes(team)
	assert.True(t, ok, "a new day on the injected clock")
	assert.EqualValues(t, 100, m["team:2026-12-07"], "yesterday's bytes stay on yesterday")
}
