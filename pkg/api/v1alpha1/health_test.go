package v1alpha1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestIsHealthyAsksAboutTheCurrentInstance(t *testing.T) {
	t0 := metav1.NewTime(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	later := metav1.NewTime(t0.Add(time.Minute))
	conds := func(ready, healthy metav1.Time) []metav1.Condition {
		return []metav1.Condition{
			{Type: ConditionReady, Status: metav1.ConditionTrue, LastTransitionTime: ready},
			{Type: ConditionHealthy, Status: metav1.ConditionTrue, LastTransitionTime: healthy},
		}
	}
	for _, tc := range []struct {
		name string
		st   ProxyStatus
		want bool
	}{
		{"stamped with this instance", ProxyStatus{Healthy: true, InstanceGeneration: 2, HealthInstanceGeneration: 2}, true},
		{"stamped with an earlier instance", ProxyStatus{Healthy: true, InstanceGeneration: 3, HealthInstanceGeneration: 2}, false},
		{"not healthy", ProxyStatus{InstanceGeneration: 2, HealthInstanceGeneration: 2}, false},
		{"unstamped, proven after Ready", ProxyStatus{Healthy: true, InstanceGeneration: 2, Conditions: conds(t0, later)}, true},
		{"unstamped, proven in Ready's second", ProxyStatus{Healthy: true, InstanceGeneration: 2, Conditions: conds(t0, t0)}, true},
		{"unstamped, Ready since the verdict", ProxyStatus{Healthy: true, InstanceGeneration: 2, Conditions: conds(later, t0)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) { assert.Equal(t, tc.want, tc.st.IsHealthy()) })
	}
}
