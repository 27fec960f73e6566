package v1alpha1

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ProxyMode says whether the controller provisions the proxy or only tracks it.
// +kubebuilder:validation:Enum=Managed;External
type ProxyMode string

const (
	// ModeManaged proxies are provisioned, replaced and deleted by a provider.
	ModeManaged ProxyMode = "Managed"
	// ModeExternal proxies exist elsewhere; the controller only tracks and
	// health-checks them and never deletes anything.
	ModeExternal ProxyMode = "External"
)

// ProxySpec is the desired state of a Proxy.
//
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || has(self.provider)",message="spec.provider is required when spec.mode is Managed",fieldPath=".provider"
// +kubebuilder:validation:XValidation:rule="self.mode != 'Managed' || !has(self.address)",message="spec.address is only allowed when spec.mode is External",fieldPath=".address"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || has(self.address)",message="spec.address is required when spec.mode is External",fieldPath=".address"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.provider)",message="spec.provider is not allowed when spec.mode is External",fieldPath=".provider"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.placement)",message="spec.placement is not allowed when spec.mode is External",fieldPath=".placement"
// +kubebuilder:validation:XValidation:rule="self.mode != 'External' || !has(self.cloudInit)",message="spec.cloudInit is not allowed when spec.mode is External",fieldPath=".cloudInit"
// +kubebuilder:validation:XValidation:rule="self.mode == 'External' || !has(self.credentialsSecretRef)",message="spec.credentialsSecretRef is only allowed when spec.mode is External",fieldPath=".credentialsSecretRef"
// +kubebuilder:validation:XValidation:rule="self.mode == oldSelf.mode",message="spec.mode is immutable: create a new Proxy instead",fieldPath=".mode"
// +kubebuilder:validation:XValidation:rule="has(self.provider) == has(oldSelf.provider) && (!has(self.provider) || self.provider == oldSelf.provider)",message="spec.provider is immutable: create a new Proxy instead",fieldPath=".provider"
type ProxySpec struct {
	// Mode is Managed (a provider creates the instance) or External (the
	// proxy runs elsewhere and is only tracked and health-checked).
	// Immutable.
	// +kubebuilder:default=Managed
	// +optional
	Mode ProxyMode `json:"mode,omitempty"`

	// Provider is the name of an entry in the controller's providers
	// config (its `name`, not its `type`, so gcp-eu and gcp-us can be two
	// entries of one type). Required for Managed, forbidden for External.
	// Immutable.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Provider string `json:"provider,omitempty"`

	// Placement says where and on what a Managed instance runs. Which
	// fields are required depends on the provider (gcp needs all three).
	// Changing it replaces the instance.
	// +optional
	Placement *Placement `json:"placement,omitempty"`

	// CloudInit is the user-data the instance boots with, inline or from a
	// labelled Secret. Changing it, or the content of the referenced
	// Secret, replaces the instance.
	// +optional
	CloudInit *CloudInit `json:"cloudInit,omitempty"`

	// Port is the TCP port the proxy listens on. Changing it replaces a
	// Managed instance.
	// +kubebuilder:default=3128
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +optional
	Port int32 `json:"port,omitempty"`

	// Address is the host name or IP of an External proxy. Required for
	// External, forbidden for Managed.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$`
	// +optional
	Address string `json:"address,omitempty"`

	// CredentialsSecretRef names a Secret in the Proxy's namespace, labelled
	// crawl.example.com/proxy-credentials=true, holding the "username" and
	// "password" an External proxy asks for (Basic Proxy-Authorization).
	// Probers authenticate with them, and the broker hands them to the
	// crawler that leases the proxy. External only.
	// +optional
	CredentialsSecretRef *LocalSecretRef `json:"credentialsSecretRef,omitempty"`

	// Attributes are free-form labels (geo, tier, ...) that lease
	// selectors match against. Changing them never replaces the instance.
	// +kubebuilder:validation:MaxProperties=32
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 63 && k.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",message="spec.attributes keys must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k].size() >= 1 && self[k].size() <= 63)",message="spec.attributes values must be 1-63 characters"
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`

	// HealthCheck overrides the controller's default probe settings for
	// this proxy. Unset fields keep the defaults.
	// +optional
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`
}

// Placement says where a Managed instance runs. Each provider documents
// what the fields mean to it and which it requires.
type Placement struct {
	// Zone is where the instance runs: a GCP zone, a KVM host name.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +optional
	Zone string `json:"zone,omitempty"`

	// MachineType is the instance size: a GCP machine type, a KVM
	// machineTypes entry.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +optional
	MachineType string `json:"machineType,omitempty"`

	// Image is the boot image: a GCP image URL or family, a KVM images
	// entry, a container image for the kubernetes provider.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`
}

// CloudInit is user-data given inline or read from a Secret; exactly one.
//
// +kubebuilder:validation:XValidation:rule="has(self.inline) != has(self.secretRef)",message="spec.cloudInit needs exactly one of inline or secretRef"
type CloudInit struct {
	// Inline is the user-data itself.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=65536
	// +optional
	Inline string `json:"inline,omitempty"`

	// SecretRef names a key of a Secret in the Proxy's namespace. The
	// Secret must carry the label crawl.example.com/cloud-init: "true";
	// the controller cannot see any other Secret.
	// +optional
	SecretRef *SecretKeyRef `json:"secretRef,omitempty"`
}

// SecretKeyRef names one key of a Secret in the Proxy's namespace.
type LocalSecretRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
}

// SecretKeyRef names a key of a Secret in the Proxy's namespace.
type SecretKeyRef struct {
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`

	// Key within the Secret's data.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:default=user-data
	// +optional
	Key string `json:"key,omitempty"`
}

// HealthCheck overrides probe settings for one proxy. Every field is
// optional; an unset field takes the controller's configured default.
// +kubebuilder:validation:XValidation:rule="!has(self.intervalSeconds) || !has(self.timeoutSeconds) || self.timeoutSeconds < self.intervalSeconds",message="spec.healthCheck.timeoutSeconds must be less than spec.healthCheck.intervalSeconds: one probe of a proxy runs at a time, so a probe must end before the next is due"
type HealthCheck struct {
	// URL fetched through the proxy: https URLs go through a CONNECT
	// tunnel and verify the target's certificate.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="spec.healthCheck.url must be an absolute http or https URL"
	// +optional
	URL string `json:"url,omitempty"`

	// ExpectedStatus is the HTTP status the target must answer with.
	// +kubebuilder:validation:Minimum=100
	// +kubebuilder:validation:Maximum=599
	// +optional
	ExpectedStatus int32 `json:"expectedStatus,omitempty"`

	// IntervalSeconds between probes of this proxy.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=3600
	// +optional
	IntervalSeconds int32 `json:"intervalSeconds,omitempty"`

	// TimeoutSeconds bounds one probe, tunnel and request together. It must
	// be below the interval; where only one of the two is set and the
	// controller's default of the other would break that, the timeout is
	// cut to the interval.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=300
	// +optional
	TimeoutSeconds int32 `json:"timeoutSeconds,omitempty"`

	// FailureThreshold consecutive failures make the proxy Unhealthy.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	FailureThreshold int32 `json:"failureThreshold,omitempty"`

	// SuccessThreshold consecutive successes make it Healthy again.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SuccessThreshold int32 `json:"successThreshold,omitempty"`
}

// ProxyPhase is a one-word summary of where a Proxy is in its life.
//
//	Pending ──▶ Provisioning ──▶ Ready ──▶ Replacing ──▶ Provisioning ...
//	   │             │             │
//	   └─────────────┴─────────────┴──▶ Failed   (terminal until the spec changes)
//	any ──▶ Deleting (deletionTimestamp set; the finalizer cleans up)
//
// External proxies go straight from Pending to Ready. The conditions carry
// the detail; the phase is for humans and `kubectl get px`.
// +kubebuilder:validation:Enum=Pending;Provisioning;Ready;Replacing;Deleting;Failed
type ProxyPhase string

const (
	// PhasePending: accepted, nothing done yet.
	PhasePending ProxyPhase = "Pending"
	// PhaseProvisioning: the instance is being created or is booting.
	PhaseProvisioning ProxyPhase = "Provisioning"
	// PhaseReady: the instance runs and has an address.
	PhaseReady ProxyPhase = "Ready"
	// PhaseReplacing: an immutable field changed; the old instance is
	// being deleted before its replacement is created.
	PhaseReplacing ProxyPhase = "Replacing"
	// PhaseDeleting: the Proxy is being deleted and its instance cleaned up.
	PhaseDeleting ProxyPhase = "Deleting"
	// PhaseFailed: the spec or config cannot work as written; the Ready
	// condition says why. Nothing is retried until the spec changes.
	PhaseFailed ProxyPhase = "Failed"
)

// ProxyStatus is the observed state of a Proxy. The controller is its only
// writer.
type ProxyStatus struct {
	// Phase summarises the conditions; see ProxyPhase.
	// +optional
	Phase ProxyPhase `json:"phase,omitempty"`

	// IP is the proxy's own address: the instance's external IP, a pod IP,
	// or an External proxy's address. Clients connect here.
	// +optional
	IP string `json:"ip,omitempty"`

	// Port is the port clients connect to.
	// +optional
	Port int32 `json:"port,omitempty"`

	// EgressIP is the address a target site sees, as echoed by the probe
	// target; it may differ from IP (NAT, upstream proxies).
	// +optional
	EgressIP string `json:"egressIP,omitempty"`

	// ProviderID identifies the current instance to its provider, e.g.
	// gcp://project/zone/name or kubernetes://namespace/name.
	// +optional
	ProviderID string `json:"providerID,omitempty"`

	// InstanceGeneration counts instances: 1 for the first, +1 per
	// replacement (a spec change, an instance lost or failed, an External
	// proxy's new address). Instance names derive from it, so a retried
	// create always names the same instance.
	// +optional
	InstanceGeneration int64 `json:"instanceGeneration,omitempty"`

	// SpecHash is the hash of the immutable spec (placement, cloud-init
	// content, port) the current instance was built from. A different hash
	// of the current spec means the instance must be replaced.
	// +optional
	SpecHash string `json:"specHash,omitempty"`

	// Healthy is true when probes through the proxy pass the success
	// threshold, false otherwise (including before the first probe).
	// +optional
	Healthy bool `json:"healthy"`

	// HealthInstanceGeneration is the instanceGeneration that healthy,
	// egressIP, lastHealthCheckTime and the Healthy condition describe.
	// The health engine writes it with them; when instanceGeneration moves
	// past it they describe an instance that is gone, the proxy is not
	// leasable (see ProxyStatus.IsHealthy), and the engine resets them.
	// +optional
	HealthInstanceGeneration int64 `json:"healthInstanceGeneration,omitempty"`

	// LastHealthCheckTime is the time of the last status-affecting probe,
	// not of the most recent probe: health writes happen on transitions
	// only, and on the first success after the brokers quarantined the
	// proxy (which ends the quarantine). Probe recency lives in the
	// proxy_operator_healthcheck_* metrics.
	// +optional
	LastHealthCheckTime *metav1.Time `json:"lastHealthCheckTime,omitempty"`

	// ObservedGeneration is the metadata.generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Ready (the instance runs and has an address) and Healthy
	// (probes through it pass).
	// +listType=map
	// +listMapKey=type
	// +patchStrategy=merge
	// +patchMergeKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
}

// Proxy is one HTTP egress proxy: provisioned by a provider (Managed) or
// run elsewhere (External), health-checked through itself, and leased to
// crawlers by the broker.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=px,categories=crawl
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Provider",type=string,JSONPath=`.spec.provider`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="IP",type=string,JSONPath=`.status.ip`
// +kubebuilder:printcolumn:name="Healthy",type=string,JSONPath=`.status.conditions[?(@.type=="Healthy")].status`
// +kubebuilder:printcolumn:name="Egress IP",type=string,JSONPath=`.status.egressIP`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Proxy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ProxySpec `json:"spec"`

	// +optional
	Status ProxyStatus `json:"status,omitempty"`
}

// ProxyList is a list of Proxies.
//
// +kubebuilder:object:root=true
type ProxyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Proxy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Proxy{}, &ProxyList{})
}

// Key returns "namespace/name", the id clients see.
func (p *Proxy) Key() string {
	return types.NamespacedName{Namespace: p.Namespace, Name: p.Name}.String()
}

// DrainDeadline reads AnnotationDrainDeadline; ok is false when the Proxy
// is not draining. A value that is not RFC 3339 drains with a deadline
// already past: whoever set it meant to take the proxy out.
func (p *Proxy) DrainDeadline() (deadline time.Time, ok bool) {
	v, ok := p.Annotations[AnnotationDrainDeadline]
	if !ok {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil || t.IsZero() {
		return time.Unix(0, 0), true
	}
	return t, true
}

// Why the brokers grant a Proxy no new lease, whatever the target: the
// lease API's notLeasable. A quarantine, a cooldown and the lease cap are
// the brokers' own state, not the object's, and are told apart.
const (
	NotLeasableDeleting    = "PROXY_DELETING"
	NotLeasableHealthStale = "PROXY_HEALTH_STALE"
	NotLeasableUnhealthy   = "PROXY_UNHEALTHY"
	NotLeasableNotReady    = "PROXY_NOT_READY"
	NotLeasableDraining    = "PROXY_DRAINING"
	NotLeasableCordoned    = "PROXY_CORDONED"
)

// IsReady reports whether the instance runs at an address clients can
// reach: Ready, phase Ready, with an IP.
func (p *Proxy) IsReady() bool {
	return meta.IsStatusConditionTrue(p.Status.Conditions, ConditionReady) && p.Status.Phase == PhaseReady && p.Status.IP != ""
}

// HealthStale reports whether the controller has had no recent probe
// result for the proxy (Healthy Unknown, reason ProbeStale).
func (p *Proxy) HealthStale() bool {
	h := meta.FindStatusCondition(p.Status.Conditions, ConditionHealthy)
	return h != nil && h.Status == metav1.ConditionUnknown && h.Reason == ReasonProbeStale
}

// NotLeasable is why the brokers grant the Proxy no new lease (one of the
// NotLeasable reasons, the first that holds in their order), or "" when
// they may. The brokers and kubectl egress both read it from here.
func (p *Proxy) NotLeasable() string {
	_, draining := p.DrainDeadline()
	switch {
	case !p.DeletionTimestamp.IsZero():
		return NotLeasableDeleting
	case p.HealthStale():
		return NotLeasableHealthStale
	case !p.Status.IsHealthy():
		return NotLeasableUnhealthy
	case !p.IsReady():
		return NotLeasableNotReady
	case draining:
		return NotLeasableDraining
	case p.Annotations[AnnotationCordoned] == "true":
		return NotLeasableCordoned
	}
	return ""
}

// IsHealthy reports whether probes prove the current instance works:
// status.healthy, about this instance. Health written for an earlier
// instance (the engine has not yet reset it) proves nothing, so every
// reader that leases or counts healthy members asks this, not
// status.healthy alone.
func (s *ProxyStatus) IsHealthy() bool {
	return s.Healthy && s.HealthIsCurrent()
}

// HealthIsCurrent reports whether the health fields describe the current
// instance. Health stamped with an instance generation describes that
// one. Health written before the stamp existed (HealthInstanceGeneration
// 0) was kept current by the lifecycle of that time, which reset it with
// every new instance; it describes this one unless the instance became
// Ready after the verdict, which only a new instance since (or a Ready
// that came and went) explains.
func (s *ProxyStatus) HealthIsCurrent() bool {
	if s.HealthInstanceGeneration != 0 {
		return s.HealthInstanceGeneration == s.InstanceGeneration
	}
	h := meta.FindStatusCondition(s.Conditions, ConditionHealthy)
	r := meta.FindStatusCondition(s.Conditions, ConditionReady)
	// Condition times have whole seconds on the wire; a Ready that is
	// not True makes the proxy unleasable on its own.
	return h == nil || r == nil || r.Status != metav1.ConditionTrue || h.LastTransitionTime.Unix() >= r.LastTransitionTime.Unix()
}
