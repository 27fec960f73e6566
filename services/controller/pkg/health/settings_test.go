package health

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// A timeout at or above the interval: refused as flags, cut to the
// interval when a Proxy sets one of the two against the other's default.
func TestTimeoutStaysBelowTheInterval(t *testing.T) {
	d := DefaultDefaults // 30s interval, 10s timeout
	bad := d
	bad.Timeout = bad.Interval
	assert.ErrorContains(t, bad.Validate(), "--health-timeout 30s must be less than --health-interval 30s")
	assert.NoError(t, d.Validate())

	cases := []struct {
		name              string
		hc                *v1.HealthCheck
		interval, timeout time.Duration
	}{
		{"defaults", nil, 30 * time.Second, 10 * time.Second},
		{"both set", &v1.HealthCheck{IntervalSeconds: 5, TimeoutSeconds: 4}, 5 * time.Second, 4 * time.Second},
		{"a short interval against the default timeout", &v1.HealthCheck{IntervalSeconds: 5}, 5 * time.Second, 5 * time.Second},
		{"a long timeout against the default interval", &v1.HealthCheck{TimeoutSeconds: 300}, 30 * time.Second, 30 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := d.Resolve(tc.hc)
			assert.Equal(t, tc.interval, s.Interval)
			assert.Equal(t, tc.timeout, s.Timeout)
		})
	}
}
