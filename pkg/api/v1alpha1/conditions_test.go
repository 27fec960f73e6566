package v1alpha1

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// An Event is a Warning exactly when its reason needs someone to act.
func TestEventType(t *testing.T) {
	for _, r := range []string{ReasonUnknownProvider, ReasonProviderUnavailable, ReasonInvalidPlacement, ReasonCloudInitError,
		ReasonQuotaExceeded, ReasonProviderError, ReasonCleanupFailed, ReasonInstanceLost, ReasonProbeStale, EventCleanupSkipped} {
		assert.Equal(t, "Warning", EventType(r), r)
	}
	for _, r := range []string{ReasonProvisioning, ReasonRunning, ReasonTracking, ReasonReplacing, ReasonDeleting,
		ReasonNotProbed, ReasonProbeSucceeded, EventProbeResumed, "SomethingNew"} {
		assert.Equal(t, "Normal", EventType(r), r)
	}
}
