package lifecycle

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Phase, Ready and address move together: an address only in phase
// Ready, withdrawn on any move to another phase, kept through an error
// that says nothing new about the instance.
func TestPhaseReadyAndAddressMoveTogether(t *testing.T) {
	ready := func() *v1.Proxy {
		px := &v1.Proxy{Spec: v1.ProxySpec{Port: 3128}}
		markReady(px, v1.ReasonRunning, "127.0.0.7", "running")
		return px
	}
	for _, tc := range []struct {
		name      string
		from      *v1.Proxy
		mark      func(*v1.Proxy)
		phase     v1.ProxyPhase
		ip        string
		condition metav1.ConditionStatus
		reason    string
	}{
		{"running", &v1.Proxy{Spec: v1.ProxySpec{Port: 3128}}, func(px *v1.Proxy) { markReady(px, v1.ReasonRunning, "127.0.0.7", "m") },
			v1.PhaseReady, "127.0.0.7", metav1.ConditionTrue, v1.ReasonRunning},
		{"replacing withdraws the address", ready(), func(px *v1.Proxy) { markNotReady(px, v1.PhaseReplacing, v1.ReasonReplacing, "m") },
			v1.PhaseReplacing, "", metav1.ConditionFalse, v1.ReasonReplacing},
		{"failed withdraws the address", ready(), func(px *v1.Proxy) { markNotReady(px, v1.PhaseFailed, v1.ReasonUnknownProvider, "m") },
			v1.PhaseFailed, "", metav1.ConditionFalse, v1.ReasonUnknownProvider},
		{"deleting withdraws the address", ready(), func(px *v1.Proxy) { markNotReady(px, v1.PhaseDeleting, v1.ReasonCleanupFailed, "m") },
			v1.PhaseDeleting, "", metav1.ConditionFalse, v1.ReasonCleanupFailed},
		{"a transient error keeps phase and address", ready(), func(px *v1.Proxy) { markError(px, v1.ReasonProviderError, "m") },
			v1.PhaseReady, "127.0.0.7", metav1.ConditionFalse, v1.ReasonProviderError},
		{"an error on a Pending proxy is Provisioning", &v1.Proxy{Status: v1.ProxyStatus{Phase: v1.PhasePending}}, func(px *v1.Proxy) { markError(px, v1.ReasonQuotaExceeded, "m") },
			v1.PhaseProvisioning, "", metav1.ConditionFalse, v1.ReasonQuotaExceeded},
		{"an error on a Failed proxy is Provisioning", &v1.Proxy{Status: v1.ProxyStatus{Phase: v1.PhaseFailed}}, func(px *v1.Proxy) { markError(px, v1.ReasonQuotaExceeded, "m") },
			v1.PhaseProvisioning, "", metav1.ConditionFalse, v1.ReasonQuotaExceeded},
		{"an error while replacing stays Replacing", &v1.Proxy{Status: v1.ProxyStatus{Phase: v1.PhaseReplacing}}, func(px *v1.Proxy) { markError(px, v1.ReasonQuotaExceeded, "m") },
			v1.PhaseReplacing, "", metav1.ConditionFalse, v1.ReasonQuotaExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			px := tc.from
			tc.mark(px)
			assert.Equal(t, tc.phase, px.Status.Phase)
			assert.Equal(t, tc.ip, px.Status.IP)
			c := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionReady)
			if assert.NotNil(t, c) {
				assert.Equal(t, tc.condition, c.Status)
				assert.Equal(t, tc.reason, c.Reason)
			}
			if px.Status.IP != "" {
				assert.Equal(t, v1.PhaseReady, px.Status.Phase, "an address only in phase Ready")
			}
		})
	}
}
