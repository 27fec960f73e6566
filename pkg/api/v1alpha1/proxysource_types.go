package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// ProxySourceSpec says where a source's proxies come from and what every
// one of them carries. Exactly one of list, url and vendor is set.
//
// +kubebuilder:validation:XValidation:rule="(has(self.list) ? 1 : 0) + (has(self.url) ? 1 : 0) + (has(self.vendor) ? 1 : 0) == 1",message="a ProxySource needs exactly one of spec.list, spec.url and spec.vendor"
type ProxySourceSpec struct {
	// List reads the proxies from a ConfigMap or a Secret.
	// +optional
	List *SourceList `json:"list,omitempty"`

	// URL fetches the proxies from an address, on an interval.
	// +optional
	URL *SourceURL `json:"url,omitempty"`

	// Vendor expands a vendor's back-connect endpoint into one proxy per
	// session (and country).
	// +optional
	Vendor *SourceVendor `json:"vendor,omitempty"`

	// Attributes every member carries, for lease selectors. A vendor
	// source's countries add `country`.
	// +kubebuilder:validation:MaxProperties=31
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.size() <= 63 && k.matches('^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$'))",message="spec.attributes keys must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
	// +kubebuilder:validation:XValidation:rule="self.all(k, self[k].size() >= 1 && self[k].size() <= 63)",message="spec.attributes values must be 1-63 characters"
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`

	// HealthCheck is every member's probe settings. A metered source
	// sets a long intervalSeconds: each probe spends the vendor's bytes.
	// +optional
	HealthCheck *HealthCheck `json:"healthCheck,omitempty"`

	// ProbeBudget caps the bytes probes through the source's members
	// spend per UTC day: the probe interval is stretched so the members'
	// probes fit in it, and between probes a member's health follows the
	// outcomes crawlers report.
	// +optional
	ProbeBudget *ProbeBudget `json:"probeBudget,omitempty"`

	// DrainTimeout is how long a member that left the source waits for
	// its live leases to end before it is deleted anyway.
	// +kubebuilder:default="10m"
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// MaxShrinkPercent is the most of the present members one sync may
	// take out. A sync that would take out more (a vendor outage, a
	// truncated list) is held until the annotation
	// crawl.example.com/confirm-shrink names its new size.
	// +kubebuilder:default=50
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	MaxShrinkPercent *int32 `json:"maxShrinkPercent,omitempty"`

	// MaxEntries bounds the members a list or URL source makes: valid
	// entries past it are counted in the Synced condition, not made. It
	// is what keeps a list, which anyone serving the URL may write, from
	// costing the controller memory or etcd objects without bound. A
	// vendor source is bounded by sessions × countries (at most 10000).
	// +kubebuilder:default=10000
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +optional
	MaxEntries *int32 `json:"maxEntries,omitempty"`
}

// SourceFormat is how a list's entries are written.
// +kubebuilder:validation:Enum=Lines;JSON
type SourceFormat string

const (
	// FormatLines: one host:port[:user:pass] per line; blank lines and
	// lines starting with # are skipped.
	FormatLines SourceFormat = "Lines"
	// FormatJSON: an array of {"host", "port", "username", "password",
	// "attributes"}.
	FormatJSON SourceFormat = "JSON"
)

// SourceList names the ConfigMap or Secret key a list lives in; exactly
// one. Either must be labelled crawl.example.com/proxy-source: "true"
// (a ConfigMap) or crawl.example.com/proxy-credentials: "true" (a Secret):
// the controller's cache holds no others.
//
// +kubebuilder:validation:XValidation:rule="has(self.configMapRef) != has(self.secretRef)",message="spec.list needs exactly one of configMapRef and secretRef"
type SourceList struct {
	// ConfigMapRef names the ConfigMap; its key defaults to "proxies".
	// +optional
	ConfigMapRef *KeyRef `json:"configMapRef,omitempty"`
	// SecretRef names the Secret; its key defaults to "proxies".
	// +optional
	SecretRef *KeyRef `json:"secretRef,omitempty"`
	// +kubebuilder:default=Lines
	// +optional
	Format SourceFormat `json:"format,omitempty"`
}

// SourceURL is a list fetched over HTTP(S). The fetch is held to the
// controller's egress policy, as probes are, and bounded in time and size.
type SourceURL struct {
	// URL of the list.
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="isURL(self) && (self.startsWith('http://') || self.startsWith('https://'))",message="spec.url.url must be an absolute http or https URL"
	// +required
	URL string `json:"url"`

	// +kubebuilder:default=Lines
	// +optional
	Format SourceFormat `json:"format,omitempty"`

	// RefreshInterval is how often the list is fetched again.
	// +kubebuilder:default="5m"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('10s')",message="spec.url.refreshInterval must be at least 10s"
	// +optional
	RefreshInterval *metav1.Duration `json:"refreshInterval,omitempty"`

	// Timeout bounds one fetch, connection and body together.
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s') && duration(self) <= duration('60s')",message="spec.url.timeout must be between 1s and 60s"
	// +optional
	Timeout *metav1.Duration `json:"timeout,omitempty"`

	// MaxBytes bounds the body; a longer one fails the fetch.
	// +kubebuilder:default=4194304
	// +kubebuilder:validation:Minimum=1024
	// +kubebuilder:validation:Maximum=67108864
	// +optional
	MaxBytes *int64 `json:"maxBytes,omitempty"`

	// CASecretRef names a key (ca.crt by default) of a Secret labelled
	// crawl.example.com/proxy-credentials holding the PEM CA the
	// server's certificate is verified with, instead of the system's.
	// +optional
	CASecretRef *KeyRef `json:"caSecretRef,omitempty"`

	// AuthSecretRef names a Secret labelled
	// crawl.example.com/proxy-credentials holding a "token" (sent as a
	// bearer token) or a "username" and "password" (basic auth).
	// +optional
	AuthSecretRef *LocalSecretRef `json:"authSecretRef,omitempty"`
}

// VendorPreset names a vendor's user-name grammar.
// +kubebuilder:validation:Enum=BrightData;Oxylabs;Decodo;Apify;Custom
type VendorPreset string

const (
	// PresetBrightData: brd-customer-<account>-zone-<zone>[-country-<cc>]-session-<s>.
	PresetBrightData VendorPreset = "BrightData"
	// PresetOxylabs: customer-<account>[-cc-<CC>]-sessid-<s>[-sesstime-<min>].
	PresetOxylabs VendorPreset = "Oxylabs"
	// PresetDecodo: user-<account>[-country-<cc>]-session-<s>[-sessionduration-<min>].
	PresetDecodo VendorPreset = "Decodo"
	// PresetApify: groups-<groups>,session-<s>[,country-<CC>].
	PresetApify VendorPreset = "Apify"
	// PresetCustom: spec.vendor.template.
	PresetCustom VendorPreset = "Custom"
)

// SourceVendor is a back-connect endpoint: one host and port behind
// which every session name is another exit. It becomes sessions proxies
// per country (sessions alone without countries), each with its own user
// name and the account's password.
//
// +kubebuilder:validation:XValidation:rule="self.preset != 'Custom' || has(self.template)",message="spec.vendor.template is required when spec.vendor.preset is Custom"
// +kubebuilder:validation:XValidation:rule="self.preset == 'Custom' || !has(self.template)",message="spec.vendor.template is only allowed when spec.vendor.preset is Custom"
// +kubebuilder:validation:XValidation:rule="self.preset != 'BrightData' || (has(self.account) && has(self.zone))",message="spec.vendor.account and spec.vendor.zone are required for BrightData"
// +kubebuilder:validation:XValidation:rule="!(self.preset in ['Oxylabs', 'Decodo']) || has(self.account)",message="spec.vendor.account is required for Oxylabs and Decodo"
// +kubebuilder:validation:XValidation:rule="self.preset != 'Apify' || has(self.groups)",message="spec.vendor.groups is required for Apify"
// +kubebuilder:validation:XValidation:rule="self.sessions * (has(self.countries) && size(self.countries) > 0 ? size(self.countries) : 1) <= 10000",message="spec.vendor.sessions times the countries must be at most 10000 proxies"
type SourceVendor struct {
	// +required
	Preset VendorPreset `json:"preset"`

	// Host of the back-connect endpoint.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9.:]*[A-Za-z0-9])?$`
	// +required
	Host string `json:"host"`

	// Port of the back-connect endpoint.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	// +required
	Port int32 `json:"port"`

	// Account is the vendor's customer or user id in the user name.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_]{1,64}$`
	// +optional
	Account string `json:"account,omitempty"`

	// Zone is Bright Data's zone.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_]{1,64}$`
	// +optional
	Zone string `json:"zone,omitempty"`

	// Groups is Apify's proxy groups, joined by '+'.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9_+]{1,128}$`
	// +optional
	Groups string `json:"groups,omitempty"`

	// Template is a Custom preset's user name: {session} (required),
	// {country} and {COUNTRY} (the country in lower and upper case) are
	// replaced.
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.contains('{session}')",message="spec.vendor.template must contain {session}"
	// +optional
	Template string `json:"template,omitempty"`

	// PasswordSecretRef names a Secret labelled
	// crawl.example.com/proxy-credentials whose "password" is the
	// account's proxy password.
	// +required
	PasswordSecretRef LocalSecretRef `json:"passwordSecretRef"`

	// Sessions is how many sessions (exits) per country.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	Sessions int32 `json:"sessions"`

	// Countries multiplies the sessions, one set per country, and sets
	// each member's country attribute (ISO 3166 alpha-2, lower case).
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^[a-z]{2}$`
	// +listType=set
	// +optional
	Countries []string `json:"countries,omitempty"`

	// SessionMinutes asks the vendor to keep each session's exit this
	// long, where the grammar has a place for it (Oxylabs sesstime,
	// Decodo sessionduration).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1440
	// +optional
	SessionMinutes int32 `json:"sessionMinutes,omitempty"`

	// SessionPrefix starts every session name; the source's name without
	// its dashes when unset. Changing it replaces every member.
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]{1,24}$`
	// +optional
	SessionPrefix string `json:"sessionPrefix,omitempty"`
}

// KeyRef names a key of a ConfigMap or Secret in the source's namespace;
// each field that takes one says what an unset key means.
type KeyRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	// +required
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[-._a-zA-Z0-9]+$`
	// +optional
	Key string `json:"key,omitempty"`
}

// ProbeBudget is a metered source's daily probe allowance.
type ProbeBudget struct {
	// BytesPerDay is the most bytes probes may spend per UTC day, both
	// ways through the proxy.
	// +kubebuilder:validation:Minimum=1024
	// +required
	BytesPerDay int64 `json:"bytesPerDay"`
}

// ProxySourceStatus is the observed state of a ProxySource.
type ProxySourceStatus struct {
	// Desired counts the entries of the last good sync.
	// +kubebuilder:default=0
	// +optional
	Desired int32 `json:"desired"`
	// Present counts members not being deleted, draining ones included.
	// +kubebuilder:default=0
	// +optional
	Present int32 `json:"present"`
	// Healthy counts Ready members whose probes pass.
	// +kubebuilder:default=0
	// +optional
	Healthy int32 `json:"healthy"`
	// Draining counts members that left the source and wait for their
	// leases to end.
	// +kubebuilder:default=0
	// +optional
	Draining int32 `json:"draining"`
	// LastSyncTime is when the source was last read successfully.
	// +optional
	LastSyncTime *metav1.Time `json:"lastSyncTime,omitempty"`
	// Rejected counts the entries of the last read that were skipped,
	// and RejectedEntries names the first of them and why.
	// +optional
	Rejected int32 `json:"rejected,omitempty"`
	// +kubebuilder:validation:MaxItems=10
	// +optional
	RejectedEntries []string `json:"rejectedEntries,omitempty"`
	// HeldShrink, while set, is a sync held by spec.maxShrinkPercent:
	// annotate crawl.example.com/confirm-shrink with its to to apply it.
	// +optional
	HeldShrink *HeldShrink `json:"heldShrink,omitempty"`
	// Probe is what a metered source's probes spent today.
	// +optional
	Probe *ProbeSpend `json:"probe,omitempty"`
	// ExitChanges counts the times a member's exit IP moved since the
	// member was made: a vendor rotating a session's exit.
	// +optional
	ExitChanges int32 `json:"exitChanges,omitempty"`
	// ObservedGeneration is the metadata.generation the status reflects.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Synced (the source was read and applied) and Ready
	// (every entry has a healthy member, none draining).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// HeldShrink is a shrink waiting for confirmation.
type HeldShrink struct {
	From int32 `json:"from"`
	To   int32 `json:"to"`
}

// ProbeSpend is a metered source's probe spending on one UTC day.
type ProbeSpend struct {
	// Day is the UTC date (YYYY-MM-DD) the figures are for.
	Day string `json:"day"`
	// SpentBytes is what probes through the members spent that day.
	SpentBytes int64 `json:"spentBytes"`
	// IntervalSeconds is the probe interval the budget allows the
	// members, which they are given.
	IntervalSeconds int32 `json:"intervalSeconds"`
}

// ProxySource keeps External Proxies in sync with a list, a URL or a
// vendor's back-connect endpoint: it adds what appears, and drains, then
// deletes, what disappears.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=psrc,categories=crawl
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desired`
// +kubebuilder:printcolumn:name="Present",type=integer,JSONPath=`.status.present`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.healthy`
// +kubebuilder:printcolumn:name="Draining",type=integer,JSONPath=`.status.draining`
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`
// +kubebuilder:printcolumn:name="Last Sync",type=date,JSONPath=`.status.lastSyncTime`
// +kubebuilder:printcolumn:name="Probe Bytes",type=integer,JSONPath=`.status.probe.spentBytes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 52",message="metadata.name must be at most 52 characters: member names add a dash and ten characters"
type ProxySource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec ProxySourceSpec `json:"spec"`

	// +optional
	Status ProxySourceStatus `json:"status,omitempty"`
}

// ProxySourceList is a list of ProxySources.
//
// +kubebuilder:object:root=true
type ProxySourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ProxySource `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ProxySource{}, &ProxySourceList{})
}

// Key returns "namespace/name".
func (s *ProxySource) Key() string {
	return types.NamespacedName{Namespace: s.Namespace, Name: s.Name}.String()
}

// Conditions and reasons of a ProxySource.
const (
	// ConditionSynced is True when the last read of the source was
	// applied; False says why nothing changed.
	ConditionSynced = "Synced"

	// ReasonSourceApplied (Synced True): the entries were applied; the
	// message counts any rejected ones.
	ReasonSourceApplied = "Applied"
	// ReasonFetchFailed: the ConfigMap, Secret or URL could not be read;
	// the message says why.
	ReasonFetchFailed = "FetchFailed"
	// ReasonNoValidEntries: the source was read but held no valid entry;
	// the message names the first bad ones.
	ReasonNoValidEntries = "NoValidEntries"
	// ReasonShrinkHeld: the sync would take out more than
	// spec.maxShrinkPercent of the members; status.heldShrink says how to
	// confirm it.
	ReasonShrinkHeld = "ShrinkHeld"
	// ReasonMembersDraining (Ready False): members that left the source
	// wait for their leases to end.
	ReasonMembersDraining = "MembersDraining"
)

// Labels and annotations of ProxySources and their members.
const (
	// LabelSource names the ProxySource a Proxy belongs to; the source
	// also owns it through a controller ownerReference.
	LabelSource = "crawl.example.com/source"
	// LabelProxySource must be "true" on a ConfigMap a source lists.
	LabelProxySource = "crawl.example.com/proxy-source"
	// AnnotationSourceEntry, on a member, is the entry it was made for:
	// host:port, and the user name when there is one.
	AnnotationSourceEntry = "crawl.example.com/source-entry"
	// AnnotationExits, on a member, lists the exit IPs probes saw through
	// it, oldest first, the last few only.
	AnnotationExits = "crawl.example.com/exits"
	// AnnotationConfirmShrink, on a ProxySource, confirms a held shrink
	// to the size it names.
	AnnotationConfirmShrink = "crawl.example.com/confirm-shrink"
	// AnnotationRefresh, on a URL ProxySource, fetches the list again
	// now whenever its value changes (`kubectl annotate --overwrite psrc
	// <name> crawl.example.com/refresh=$(date +%s)`).
	AnnotationRefresh = "crawl.example.com/refresh"
)

// Events of a ProxySource.
const (
	// EventSourceExitChanged: a member's exit IP moved.
	EventSourceExitChanged = "ExitChanged"
)
