// Package probespec holds the rules of a probe that the controller, which
// hands out probe settings, and the prober, which follows them, must read
// alike: the defaults, the echo format, the names of the phases a probe
// fails in.
package probespec

import (
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"time"

	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
)

// The probe interval and timeout where neither the controller's flags nor
// spec.healthCheck set one. A prober given none (an older controller)
// uses them too.
const (
	DefaultInterval = 30 * time.Second
	DefaultTimeout  = 10 * time.Second
)

// The echo formats: how a health-check target tells the caller's address
// back, which becomes status.egressIP.
const (
	// EchoNone: the target does not echo.
	EchoNone = ""
	// EchoText: the body is the caller's IP.
	EchoText = "text"
	// EchoJSONPrefix, followed by a field name: the body is a JSON object
	// whose field is the caller's IP.
	EchoJSONPrefix = "json:"
)

// ValidateEchoFormat says what is wrong with an echo format, or nil.
func ValidateEchoFormat(format string) error {
	if format == EchoNone || format == EchoText || (strings.HasPrefix(format, EchoJSONPrefix) && len(format) > len(EchoJSONPrefix)) {
		return nil
	}
	return fmt.Errorf(`echo format %q must be "", %q or "%s<field>"`, format, EchoText, EchoJSONPrefix)
}

// EchoedIP reads the caller's address from a target's answer; "" when
// the format is unset or invalid, or the answer holds no IP.
func EchoedIP(format string, body []byte) string {
	var s string
	switch {
	case format == EchoText:
		s = strings.TrimSpace(string(body))
	case strings.HasPrefix(format, EchoJSONPrefix) && len(format) > len(EchoJSONPrefix):
		var m map[string]any
		if json.Unmarshal(body, &m) != nil {
			return ""
		}
		s, _ = m[strings.TrimPrefix(format, EchoJSONPrefix)].(string)
	default:
		return ""
	}
	if ip := net.ParseIP(s); ip != nil {
		return ip.String()
	}
	return ""
}

// PhaseName is a probe phase's short name: "DIAL", "CONNECT", "TLS",
// "HTTP", "STATUS", or "none" for a probe that did not fail (or an unknown
// phase from a newer prober).
func PhaseName(p probev1.ProbePhase) string {
	s, ok := probev1.ProbePhase_name[int32(p)]
	if !ok || p == probev1.ProbePhase_PROBE_PHASE_UNSPECIFIED {
		return "none"
	}
	return strings.TrimPrefix(s, "PROBE_PHASE_")
}
