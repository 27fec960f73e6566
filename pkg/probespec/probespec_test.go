package probespec

import (
	"testing"

	"github.com/stretchr/testify/assert"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
)

func TestEchoFormats(t *testing.T) {
	for _, tc := range []struct {
		format, body, ip string
		valid            bool
	}{
		{"", "203.0.113.7", "", true},
		{"text", " 203.0.113.7\n", "203.0.113.7", true},
		{"text", "<html>", "", true},
		{"json:origin", `{"origin":"2001:db8::1"}`, "2001:db8::1", true},
		{"json:origin", `{"ip":"203.0.113.7"}`, "", true},
		{"json:origin", `not json`, "", true},
		{"json:", `{"":"203.0.113.7"}`, "", false},
		{"xml", "203.0.113.7", "", false},
		{"TEXT", "203.0.113.7", "", false},
	} {
		err := ValidateEchoFormat(tc.format)
		if tc.valid {
			assert.NoError(t, err, tc.format)
		} else {
			assert.ErrorContains(t, err, tc.format, "the error names the bad format")
		}
		assert.Equal(t, tc.ip, EchoedIP(tc.format, []byte(tc.body)), "%q on %q", tc.format, tc.body)
	}
}

func TestPhaseNames(t *testing.T) {
	assert.Equal(t, "DIAL", PhaseName(probev1.ProbePhase_PROBE_PHASE_DIAL))
	assert.Equal(t, "STATUS", PhaseName(probev1.ProbePhase_PROBE_PHASE_STATUS))
	assert.Equal(t, "none", PhaseName(probev1.ProbePhase_PROBE_PHASE_UNSPECIFIED))
	assert.Equal(t, "none", PhaseName(probev1.ProbePhase(99)), "a phase from a newer prober")
}
