package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Condition types.
const (
	// ConditionReady is True when the instance runs and has an address a
	// client can connect to.
	ConditionReady = "Ready"
	// ConditionHealthy is True when probes through the proxy pass; Unknown
	// until the first threshold is reached.
	ConditionHealthy = "Healthy"
)

// Reasons of the Ready condition.
const (
	// ReasonProvisioning: the instance is being created or is booting.
	ReasonProvisioning = "Provisioning"
	// ReasonRunning: the instance runs and has an address.
	ReasonRunning = "Running"
	// ReasonTracking: an External proxy, tracked at its address.
	ReasonTracking = "Tracking"
	// ReasonReplacing: an immutable field changed; the old instance is
	// being deleted before a new one is created.
	ReasonReplacing = "Replacing"
	// ReasonInstanceLost: the recorded instance disappeared outside the
	// controller; a new one is being created.
	ReasonInstanceLost = "InstanceLost"
	// ReasonUnknownProvider: spec.provider names no providers-config entry.
	ReasonUnknownProvider = "UnknownProvider"
	// ReasonProviderUnavailable: the entry exists but cannot be used
	// (credentials missing, client construction failed).
	ReasonProviderUnavailable = "ProviderUnavailable"
	// ReasonInvalidPlacement: the placement cannot work (a required field
	// is missing, an unknown zone or size); the message names the field.
	ReasonInvalidPlacement = "InvalidPlacement"
	// ReasonCloudInitError: the cloud-init Secret is missing, unlabelled,
	// or lacks the key.
	ReasonCloudInitError = "CloudInitError"
	// ReasonQuotaExceeded: the provider is out of quota or capacity; the
	// controller waits and retries.
	ReasonQuotaExceeded = "QuotaExceeded"
	// ReasonProviderError: a transient provider error; retried with backoff.
	ReasonProviderError = "ProviderError"
	// ReasonDeleting: the instance is being deleted with the Proxy.
	ReasonDeleting = "Deleting"
	// ReasonCleanupFailed: deleting the instance keeps failing; the
	// Proxy stays Terminating until it succeeds or skip-cleanup is set.
	ReasonCleanupFailed = "CleanupFailed"
)

// Reasons of the Healthy condition.
const (
	// ReasonNotProbed: no threshold reached yet.
	ReasonNotProbed = "NotProbed"
	// ReasonProbeSucceeded: the success threshold was reached.
	ReasonProbeSucceeded = "ProbeSucceeded"
	// ReasonProbeFailed: the failure threshold was reached; the message
	// names the failing phase and reason of the last probe.
	ReasonProbeFailed = "ProbeFailed"
	// ReasonProbeStale: no probe result arrived for the controller's
	// --health-stale-intervals of the proxy's interval (default 3); the
	// condition is Unknown and the proxy is not leasable until a result
	// arrives. Probing has stopped: no prober runs, or none reaches the
	// leading controller.
	ReasonProbeStale = "ProbeStale"
	// ReasonProbeDenied: the proxy's address, or its health-check URL's
	// host, is in the controller's --probe-deny-cidrs; it is never probed
	// and never leased. The message names the address and the range.
	ReasonProbeDenied = "ProbeDenied"
)

// Reasons of Events that record no condition change.
const (
	// EventProbeResumed: probe results arrive again after ProbeStale.
	EventProbeResumed = "ProbeResumed"
	// EventCleanupSkipped: a Terminating Proxy annotated skip-cleanup was
	// released and its instance abandoned.
	EventCleanupSkipped = "CleanupSkipped"
)

// warningReasons are the reasons that need someone to act: their Events
// are Warnings. Every other reason is routine and its Event Normal.
var warningReasons = map[string]bool{
	ReasonUnknownProvider: true, ReasonProviderUnavailable: true, ReasonInvalidPlacement: true,
	ReasonCloudInitError: true, ReasonQuotaExceeded: true, ReasonProviderError: true,
	ReasonCleanupFailed: true, ReasonInstanceLost: true, ReasonProbeStale: true,
	EventCleanupSkipped: true,
}

// EventType is the type of the Event that records reason: "Warning" when
// someone has to act, else "Normal".
func EventType(reason string) string {
	if warningReasons[reason] {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// Labels and annotations the project owns.
const (
	// LabelCloudInit must be "true" on a Secret referenced by
	// spec.cloudInit.secretRef; the controller's cache holds no others.
	LabelCloudInit = "crawl.example.com/cloud-init"
	// AnnotationSkipCleanup set to "true" on a Terminating Proxy abandons
	// its instance and releases the object.
	AnnotationSkipCleanup = "crawl.example.com/skip-cleanup"
	// Finalizer guards instance deletion.
	Finalizer = "crawl.example.com/instance-cleanup"
)
