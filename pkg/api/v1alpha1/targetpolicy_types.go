package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TargetPolicySpec says how the brokers treat leases and outcome reports
// for some target sites. Every field but targets is optional: the
// brokers' flags give what a policy leaves out, and what no policy matches.
type TargetPolicySpec struct {
	// Targets are the host names the policy applies to, lower case. An
	// entry "*.example.com" matches every name under example.com (not
	// example.com itself). When several policies match a target, an exact
	// name wins over a wildcard, a longer wildcard over a shorter one, and
	// among equals the oldest policy (then namespace/name) wins.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=253
	// +kubebuilder:validation:items:Pattern=`^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	// +listType=set
	// +required
	Targets []string `json:"targets"`

	// Cooldown is how long a rate_limited or blocked report keeps the
	// proxy's exit IP away from the target.
	// +optional
	Cooldown *CooldownPolicy `json:"cooldown,omitempty"`

	// MaxCoolingFraction is the largest share of the proxies a lease's
	// selector matches that may cool down for the target at once. A report
	// that would pass it paces the target instead: it is throttling the
	// fleet, not the proxies. 1 never paces.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=1
	// +optional
	MaxCoolingFraction *float64 `json:"maxCoolingFraction,omitempty"`

	// MaxConcurrentLeases caps the live leases for the target across the
	// fleet; a lease past it is refused with TARGET_AT_CAP. Unset: no cap.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxConcurrentLeases *int32 `json:"maxConcurrentLeases,omitempty"`

	// Pacing bounds the fleet-wide lease rate of a paced target.
	// +optional
	Pacing *PacingPolicy `json:"pacing,omitempty"`
}

// CooldownPolicy bounds escalating cooldowns.
// +kubebuilder:validation:XValidation:rule="!has(self.base) || !has(self.max) || duration(self.base) <= duration(self.max)",message="spec.cooldown.base must not be above spec.cooldown.max"
type CooldownPolicy struct {
	// Base is the first cooldown.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="spec.cooldown.base must be at least 1s"
	// +optional
	Base *metav1.Duration `json:"base,omitempty"`
	// Max bounds a cooldown however often it doubled.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) <= duration('168h')",message="spec.cooldown.max must be at most 168h"
	// +optional
	Max *metav1.Duration `json:"max,omitempty"`
	// Window is how long after a cooldown ends another report doubles the
	// next one, and how long pacing lasts with no report.
	// +kubebuilder:validation:Type=string
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('168h')",message="spec.cooldown.window must be between 1s and 168h"
	// +optional
	Window *metav1.Duration `json:"window,omitempty"`
}

// PacingPolicy bounds a paced target's rate, in leases per second across
// the fleet.
// +kubebuilder:validation:XValidation:rule="!has(self.min) || !has(self.initial) || self.min <= self.initial",message="spec.pacing.min must not be above spec.pacing.initial"
// +kubebuilder:validation:XValidation:rule="!has(self.initial) || !has(self.max) || self.initial <= self.max",message="spec.pacing.initial must not be above spec.pacing.max"
// +kubebuilder:validation:XValidation:rule="!has(self.min) || !has(self.max) || self.min <= self.max",message="spec.pacing.min must not be above spec.pacing.max"
type PacingPolicy struct {
	// Initial is the rate pacing starts at.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=100000
	// +optional
	Initial *float64 `json:"initial,omitempty"`
	// Min is the floor a burst of rate_limited reports cuts the rate to.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=100000
	// +optional
	Min *float64 `json:"min,omitempty"`
	// Max ends pacing: ok reports that raise the rate to it lift the pace.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:ExclusiveMinimum=true
	// +kubebuilder:validation:Maximum=100000
	// +optional
	Max *float64 `json:"max,omitempty"`
}

// TargetPolicy tunes ban-aware leasing for some target sites. The brokers
// read it (they never write it), so it has no status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=tpol,categories=crawl
// +kubebuilder:printcolumn:name="Targets",type=string,JSONPath=`.spec.targets`
// +kubebuilder:printcolumn:name="Max-Leases",type=integer,JSONPath=`.spec.maxConcurrentLeases`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type TargetPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TargetPolicySpec `json:"spec"`
}

// TargetPolicyList is a list of TargetPolicies.
//
// +kubebuilder:object:root=true
type TargetPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []TargetPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&TargetPolicy{}, &TargetPolicyList{})
}

// Key returns "namespace/name".
func (p *TargetPolicy) Key() string {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}.String()
}
