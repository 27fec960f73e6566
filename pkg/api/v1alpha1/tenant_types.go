package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TenantVerb is something a tenant may do with the brokers.
// +kubebuilder:validation:Enum=list;watch;lease;report;gateway;inspect
type TenantVerb string

// Tenant verbs.
const (
	// VerbList: ListProxies, ListRefusals, and ListLeases, ExplainProxy
	// and ExplainTarget about its own leases and reports.
	VerbList TenantVerb = "list"
	// VerbWatch: WatchProxies.
	VerbWatch TenantVerb = "watch"
	// VerbLease: CreateLease, RenewLease and ReleaseLease on its own leases.
	VerbLease TenantVerb = "lease"
	// VerbReport: ReportLease and ReportSession on its own leases and
	// sessions.
	VerbReport TenantVerb = "report"
	// VerbGateway: tunnels through the proxy gateway, which leases,
	// reports and releases for them. A tenant with only this verb cannot
	// call the lease API, whose leases carry proxies' credentials.
	VerbGateway TenantVerb = "gateway"
	// VerbInspect: ListLeases, ExplainProxy and ExplainTarget show every
	// tenant's leases, cooldowns and reports on the proxies it may list,
	// not only its own: an operator's or a console's credential.
	VerbInspect TenantVerb = "inspect"
)

// AllNamespaces in spec.namespaces lets a tenant use every namespace's
// proxies.
const AllNamespaces = "*"

// TenantSpec is what one crawler team may do with the fleet, and how
// much. A Tenant lives in the brokers' namespace: whoever may create one
// there grants fleet access, as whoever may create a RoleBinding grants
// cluster access.
type TenantSpec struct {
	// Credentials are the Secrets holding the tenant's bearer tokens. Any
	// of them is accepted, so a rotation adds the new Secret, moves the
	// crawlers to it, then removes the old one, with no restart and no
	// refused request. The brokers re-read them every few seconds; a
	// removed credential ends the gateway tunnels opened with it.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=2
	// +listType=atomic
	// +required
	Credentials []TenantCredential `json:"credentials"`

	// Namespaces are where the tenant's proxies are: it lists, watches
	// and leases only Proxies in them, and a request that names no
	// namespace (a gateway user with no namespace=) means all of them.
	// "*" alone means every namespace.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)$`
	// +kubebuilder:validation:XValidation:rule="!self.exists(n, n == '*') || size(self) == 1",message="spec.namespaces: \"*\" (every namespace) must be the only entry"
	// +listType=set
	// +required
	Namespaces []string `json:"namespaces"`

	// Selector holds attributes every proxy the tenant sees carries: its
	// requests' selectors are narrowed by it, and a request asking for
	// another value of one of these attributes is refused.
	// +kubebuilder:validation:MaxProperties=16
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$') && size(self[k]) >= 1 && size(self[k]) <= 63)",message="spec.selector: keys are 1-63 letters, digits, '-', '_' or '.', values 1-63 characters"
	// +optional
	Selector map[string]string `json:"selector,omitempty"`

	// Verbs are what the tenant may do. Unset: list, watch, lease and
	// report (everything but the gateway and inspect). ["gateway"] is a
	// credential for the gateway only: sniffed from a proxy URL, it cannot
	// call the API. inspect shows every tenant's leases and cooldowns in
	// the operator's reads: an operator's credential, not a crawler's.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=6
	// +listType=set
	// +optional
	Verbs []TenantVerb `json:"verbs,omitempty"`

	// Quotas bound the tenant's use of the fleet; an unset quota is the
	// brokers' flag of the same name.
	// +optional
	Quotas TenantQuotas `json:"quotas,omitempty"`

	// Trusted makes the tenant's reports count for every tenant at once,
	// as the token file's do. An untrusted tenant's rate_limited, blocked
	// and error reports cool the proxy for the target for that tenant
	// alone, until another tenant's ban on the same exit agrees; its
	// errors quarantine a proxy only beside another tenant's; its ok
	// leaves a target's pace alone. So its false reports cost itself,
	// not the fleet (docs/security.md, section 7).
	// +optional
	Trusted bool `json:"trusted,omitempty"`
}

// TenantCredential names one Secret key holding a bearer token. The
// brokers read only the Secrets named here: grant them get on each (the
// chart does for the tenants it declares).
type TenantCredential struct {
	// Namespace of the Secret; unset: the Tenant's own.
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Name of the Secret.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
	// Key in the Secret's data; unset: token.
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
}

// TenantQuotas bound one tenant. MaxLeases, leasesPerMinute and
// gatewayBytesPerDay hold across the fleet (the brokers count them in
// Redis); the others on each broker.
type TenantQuotas struct {
	// MaxLeases caps the tenant's live leases, gateway tunnels' included.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxLeases *int32 `json:"maxLeases,omitempty"`
	// LeasesPerMinute caps the leases the tenant takes a minute.
	// +kubebuilder:validation:Minimum=1
	// +optional
	LeasesPerMinute *int32 `json:"leasesPerMinute,omitempty"`
	// ReportsPerSecond caps the tenant's outcome reports (the gateway's
	// own observations are not counted).
	// +kubebuilder:validation:Minimum=1
	// +optional
	ReportsPerSecond *int32 `json:"reportsPerSecond,omitempty"`
	// MaxTunnels caps the tenant's open gateway tunnels.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxTunnels *int32 `json:"maxTunnels,omitempty"`
	// MaxWatches caps the tenant's open WatchProxies streams.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxWatches *int32 `json:"maxWatches,omitempty"`
	// GatewayBytesPerDay caps the bytes the tenant's gateway tunnels carry
	// (both ways) in a UTC day, across the brokers: a tunnel counts when
	// it ends, and past the cap new tunnels are refused until midnight.
	// +kubebuilder:validation:XValidation:rule="quantity(self).isGreaterThan(quantity('0'))",message="spec.quotas.gatewayBytesPerDay must be positive"
	// +optional
	GatewayBytesPerDay *resource.Quantity `json:"gatewayBytesPerDay,omitempty"`
	// MaxSelectors caps the distinct selectors (namespace and attributes)
	// the tenant leases with in an index's idle time: past it, a lease on
	// a selector no index holds yet is refused, so one tenant cannot evict
	// everyone's indexes.
	// +kubebuilder:validation:Minimum=1
	// +optional
	MaxSelectors *int32 `json:"maxSelectors,omitempty"`
}

// TenantStatus is what the brokers last saw of the tenant.
type TenantStatus struct {
	// ObservedGeneration is the generation the brokers last read.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (every credential was read).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty" patchStrategy:"merge" patchMergeKey:"type"`
	// Leases is the tenant's live leases, fleet-wide.
	// +optional
	Leases int32 `json:"leases,omitempty"`
	// LastSeen is when a broker last served the tenant (to a minute).
	// +optional
	LastSeen *metav1.Time `json:"lastSeen,omitempty"`
}

// Tenant is one crawler team's access to the fleet: its credentials,
// the namespaces and attributes of the proxies it may use, its verbs and
// its quotas. The brokers read it; they write only its status.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=crawl
// +kubebuilder:printcolumn:name="Namespaces",type=string,JSONPath=`.spec.namespaces`
// +kubebuilder:printcolumn:name="Verbs",type=string,JSONPath=`.spec.verbs`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Leases",type=integer,JSONPath=`.status.leases`
// +kubebuilder:printcolumn:name="Last-Seen",type=date,JSONPath=`.status.lastSeen`
type Tenant struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec TenantSpec `json:"spec"`
	// +optional
	Status TenantStatus `json:"status,omitempty"`
}

// TenantList is a list of Tenants.
//
// +kubebuilder:object:root=true
type TenantList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Tenant `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Tenant{}, &TenantList{})
}

// Reasons of a Tenant's Ready condition.
const (
	// ReasonCredentialsRead: every credential Secret was read.
	ReasonCredentialsRead = "CredentialsRead"
	// ReasonCredentialMissing: a credential Secret or key could not be
	// read; the message names it. The others still work.
	ReasonCredentialMissing = "CredentialMissing"
	// ReasonCredentialUnreadable: a credential Secret's read fails for a
	// reason that may pass (Forbidden, the API server unreachable): its
	// token is kept as last read for the brokers' grace, then refused.
	ReasonCredentialUnreadable = "CredentialUnreadable"
)
