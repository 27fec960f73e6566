package v1alpha1

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// ProxyPoolSpec is the desired state of a ProxyPool.
//
// +kubebuilder:validation:XValidation:rule="!has(self.strategy) || !has(self.strategy.maxSurge) || !has(self.strategy.maxUnavailable) || self.strategy.maxSurge != 0 || self.strategy.maxUnavailable != 0",message="spec.strategy.maxSurge and spec.strategy.maxUnavailable must not both be 0: a rollout could neither add a member nor remove one"
type ProxyPoolSpec struct {
	// Replicas is how many members the pool keeps. The /scale subresource
	// writes it, so `kubectl scale`, an HPA or KEDA can drive it.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=10000
	// +optional
	Replicas *int32 `json:"replicas,omitempty"`

	// Template is what every member is made from.
	// +required
	Template ProxyTemplate `json:"template"`

	// Strategy bounds a rollout of a template change.
	// +optional
	Strategy *RolloutStrategy `json:"strategy,omitempty"`

	// Disruption bounds how many members are being taken out at once.
	// +optional
	Disruption *Disruption `json:"disruption,omitempty"`

	// DrainTimeout is how long a draining member waits for its live
	// leases to be released or expire before it is deleted anyway.
	// +kubebuilder:default="10m"
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// MaxAge replaces members older than it, make-before-break: a fresh
	// instance (and egress IP) on a schedule. Each member's limit is up
	// to a tenth earlier, fixed by its UID, so members made together do
	// not all rotate together. Unset: members are never rotated for age.
	// +optional
	MaxAge *metav1.Duration `json:"maxAge,omitempty"`

	// RolloutAfter replaces, once it has passed, every member created
	// before it, make-before-break within spec.strategy and
	// spec.disruption: a rotation of the whole pool with no template
	// change (`kubectl egress rotate` sets it to now), as a
	// MachineDeployment's rolloutAfter does. Members made since stay.
	// Creation times have whole seconds, so a member made in its second
	// is not before it: `rotate` sets the next second.
	// +optional
	RolloutAfter *metav1.Time `json:"rolloutAfter,omitempty"`

	// DistinctEgressIPs: when two members are seen with the same
	// status.egressIP, the newer is replaced; a slot retries up to
	// spec.remediation.maxRetries times, then stays and the pool says why.
	// +optional
	DistinctEgressIPs bool `json:"distinctEgressIPs,omitempty"`

	// Remediation replaces members that do not come up or stop being
	// healthy.
	// +optional
	Remediation *Remediation `json:"remediation,omitempty"`

	// Autoscaling lets the controller set spec.replicas from lease
	// demand, within bounds. Leave it unset to drive /scale yourself (an
	// HPA, KEDA, kubectl scale).
	// +optional
	Autoscaling *Autoscaling `json:"autoscaling,omitempty"`
}

// Autoscaling sizes a pool from lease demand, as the broker reports it.
//
// +kubebuilder:validation:XValidation:rule="self.minReplicas <= self.maxReplicas",message="spec.autoscaling.minReplicas must not be above maxReplicas"
type Autoscaling struct {
	// MinReplicas is the fewest members the autoscaler keeps.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MinReplicas int32 `json:"minReplicas"`

	// MaxReplicas is the most members the autoscaler makes.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MaxReplicas int32 `json:"maxReplicas"`

	// TargetLeasesPerProxy is the live leases per leasable member the
	// pool is sized for: above it the pool grows, well below it (after
	// the stabilization window) it shrinks.
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	TargetLeasesPerProxy int32 `json:"targetLeasesPerProxy,omitempty"`

	// ScaleDownStabilization is how long demand must have asked for
	// fewer members before the pool shrinks: it shrinks to the largest
	// size asked for in that window.
	// +kubebuilder:default="5m"
	// +optional
	ScaleDownStabilization *metav1.Duration `json:"scaleDownStabilization,omitempty"`
}

// Remediation says when a failed member is replaced.
type Remediation struct {
	// StartupTimeout: a member not Ready this long after its creation is
	// replaced.
	// +kubebuilder:default="15m"
	// +optional
	StartupTimeout *metav1.Duration `json:"startupTimeout,omitempty"`

	// UnhealthyTimeout: a Ready member unhealthy for this long is
	// replaced.
	// +kubebuilder:default="10m"
	// +optional
	UnhealthyTimeout *metav1.Duration `json:"unhealthyTimeout,omitempty"`

	// MaxUnhealthy: when a member is due for remediation while more
	// members than this (a count, or a percentage of replicas rounded up)
	// are unhealthy, due or not yet, the fault is probably not theirs (the
	// health-check target, the network): nothing is replaced, and the
	// RemediationPaused condition says why.
	// +kubebuilder:default="40%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$')",message="spec.remediation.maxUnhealthy must be a non-negative count or a percentage such as 40%"
	// +optional
	MaxUnhealthy *intstr.IntOrString `json:"maxUnhealthy,omitempty"`

	// MaxRetries is how many failed members in a row one slot replaces
	// before it gives up (the member stays, and the pool says why). A
	// member healthy for unhealthyTimeout starts its slot's count again.
	// +kubebuilder:default=5
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxRetries *int32 `json:"maxRetries,omitempty"`

	// RetryBackoff is how long after its failure a slot's first retry
	// waits; each next retry waits twice as long, up to an hour.
	// +kubebuilder:default="30s"
	// +optional
	RetryBackoff *metav1.Duration `json:"retryBackoff,omitempty"`
}

// ProxyTemplate is the metadata and spec of the Proxies a pool creates.
type ProxyTemplate struct {
	// Metadata holds the labels and annotations every member carries.
	// Changing them updates members in place.
	// +optional
	Metadata ProxyTemplateMeta `json:"metadata,omitempty"`

	// Spec is the members' ProxySpec; members are always Managed.
	// +required
	Spec ProxyTemplateSpec `json:"spec"`
}

// ProxyTemplateMeta is the metadata members are made with. Keys under
// crawl.example.com/ are the pool's own (its label, the template hash, a
// drain, a slot's retries) and may not be templated.
type ProxyTemplateMeta struct {
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('crawl.example.com/'))",message="spec.template.metadata.labels may not use the crawl.example.com/ prefix: the pool sets those labels itself"
	// +optional
	Labels map[string]string `json:"labels,omitempty"`
	// +kubebuilder:validation:MaxProperties=64
	// +kubebuilder:validation:XValidation:rule="self.all(k, !k.startsWith('crawl.example.com/'))",message="spec.template.metadata.annotations may not use the crawl.example.com/ prefix: the pool and the controller set those annotations themselves"
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ProxyTemplateSpec is a Managed ProxySpec. A change to provider,
// placement, cloudInit or port rolls new members through the pool (see
// spec.strategy); a change to attributes or healthCheck is applied to the
// members in place, as it would be to a lone Proxy.
type ProxyTemplateSpec struct {
	// Provider names an entry of the controller's providers config.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +required
	Provider string `json:"provider"`

	// +optional
	Placement *Placement `json:"placement,omitempty"`

	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`

	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 63 && k.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",message="spec.template.spec.attributes keys must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k].size() >= 1 && self[k].size() <= 63)",message="spec.template.spec.attributes values must be 1-63 characters"
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`

	// +optional
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`
}

// RolloutStrategy bounds a template rollout, as a Deployment's
// RollingUpdate does.
type RolloutStrategy struct {
	// MaxSurge is how many members above spec.replicas may exist while
	// replacements come up: a count or a percentage of replicas, rounded
	// up.
	// +kubebuilder:default=1
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$')",message="spec.strategy.maxSurge must be a non-negative count or a percentage such as 25%"
	// +optional
	MaxSurge *intstr.IntOrString `json:"maxSurge,omitempty"`

	// MaxUnavailable is how far Healthy members may drop below
	// spec.replicas while old members drain: a count or a percentage of
	// replicas, rounded down. 0 is make-before-break only.
	// +kubebuilder:default=0
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]{1,3}%$')",message="spec.strategy.maxUnavailable must be a non-negative count or a percentage such as 25%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// Disruption bounds voluntary disruption across every cause.
type Disruption struct {
	// MaxUnavailable is how many members may be draining at once, for any
	// cause (scale-down, rollout): a count or a percentage of replicas,
	// rounded up, so a pool can always make progress.
	// +kubebuilder:default="10%"
	// +kubebuilder:validation:XIntOrString
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 1 : self.matches('^[0-9]{1,3}%$')",message="spec.disruption.maxUnavailable must be a count of at least 1 or a percentage such as 10%"
	// +optional
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// ProxyPoolStatus is the observed state of a ProxyPool.
type ProxyPoolStatus struct {
	// Replicas counts members not being deleted, draining ones included.
	// +kubebuilder:default=0
	// +optional
	Replicas int32 `json:"replicas"`
	// ReadyReplicas counts members whose Ready condition is True.
	// +kubebuilder:default=0
	// +optional
	ReadyReplicas int32 `json:"readyReplicas"`
	// HealthyReplicas counts Ready members whose probes pass.
	// +kubebuilder:default=0
	// +optional
	HealthyReplicas int32 `json:"healthyReplicas"`
	// LeasedReplicas counts members holding at least one live lease, as
	// the broker last reported.
	// +kubebuilder:default=0
	// +optional
	LeasedReplicas int32 `json:"leasedReplicas"`
	// UpdatedReplicas counts members made from the current template.
	// +kubebuilder:default=0
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas"`
	// DrainingReplicas counts members being drained.
	// +kubebuilder:default=0
	// +optional
	DrainingReplicas int32 `json:"drainingReplicas"`
	// Selector is the label selector of the members, for the /scale
	// subresource (and so an HPA can find them).
	// +optional
	Selector string `json:"selector,omitempty"`
	// ObservedGeneration is the metadata.generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (every member Healthy and up to date, none
	// draining) and Progressing (a scale, rollout or drain is under way).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ProxyPool keeps a number of identical Managed Proxies, replacing them
// make-before-break and draining their leases before it deletes them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=ppool,categories=crawl
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthyReplicas`
// +kubebuilder:printcolumn:name="Leased",type=integer,JSONPath=`.status.leasedReplicas`
// +kubebuilder:printcolumn:name="Up-to-date",type=integer,JSONPath=`.status.updatedReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 57",message="metadata.name must be at most 57 characters: member names add a dash and up to five digits"
type ProxyPool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ProxyPoolSpec `json:"spec"`

	// +optional
	Status ProxyPoolStatus `json:"status,omitempty"`
}

// ProxyPoolList is a list of ProxyPools.
//
// +kubebuilder:object:root=true
type ProxyPoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxyPool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ProxyPool{}, &ProxyPoolList{})
}

// Key returns "namespace/name".
func (p *ProxyPool) Key() string {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}.String()
}

// DefaultStartupTimeout is spec.remediation.startupTimeout when unset.
const DefaultStartupTimeout = 15 * time.Minute

// DesiredReplicas is spec.replicas, 1 when unset (as the CRD defaults it).
func (p *ProxyPool) DesiredReplicas() int {
	if p.Spec.Replicas == nil {
		return 1
	}
	return int(*p.Spec.Replicas)
}

// StartupTimeout is how long after its creation a member may take to be
// Ready: the rollout replaces one that takes longer, and the autoscaler
// waits for one that may still come up.
func (p *ProxyPool) StartupTimeout() time.Duration {
	if r := p.Spec.Remediation; r != nil && r.StartupTimeout != nil {
		return r.StartupTimeout.Duration
	}
	return DefaultStartupTimeout
}
