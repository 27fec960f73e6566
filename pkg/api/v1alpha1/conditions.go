package v1alpha1

import corev1 "k8s.io/api/core/v1"

// Condition types.
const (
	// ConditionReady is True when the instance runs and has an address a
	// client can connect to (on a ProxyPool: see ConditionProgressing).
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

// Condition types of a ProxyPool.
const (
	// ConditionProgressing is True while members are being created,
	// drained or deleted to reach the spec. A pool's Ready condition is
	// True when it has spec.replicas members, all up to date and Healthy,
	// none draining.
	ConditionProgressing = "Progressing"
	// ConditionRemediationPaused is True while too many members are
	// unhealthy at once for any to be replaced.
	ConditionRemediationPaused = "RemediationPaused"
)

// Reasons of a ProxyPool's conditions.
const (
	// ReasonAsDesired: the pool is what its spec asks for.
	ReasonAsDesired = "AsDesired"
	// ReasonScalingUp: members are being created.
	ReasonScalingUp = "ScalingUp"
	// ReasonScalingDown: surplus members are draining.
	ReasonScalingDown = "ScalingDown"
	// ReasonRollingOut: members made from an older template are being
	// replaced, make-before-break.
	ReasonRollingOut = "RollingOut"
	// ReasonMembersNotHealthy: some members are not yet (or no longer)
	// Ready and Healthy.
	ReasonMembersNotHealthy = "MembersNotHealthy"
	// ReasonDisruptionBlocked: members that must go are annotated
	// do-not-disrupt; the message names them.
	ReasonDisruptionBlocked = "DisruptionBlocked"
	// ReasonReplacingMembers: members are being replaced,
	// make-before-break, because they failed (remediation, a shared
	// egress IP) or reached maxAge.
	ReasonReplacingMembers = "ReplacingMembers"
	// ReasonRetriesExhausted: a member failed and its slot has used its
	// retries; it stays until someone acts. The message says why.
	ReasonRetriesExhausted = "RetriesExhausted"
	// ReasonTooManyUnhealthy (RemediationPaused True): more members are
	// due for remediation than maxUnhealthy allows.
	ReasonTooManyUnhealthy = "TooManyUnhealthy"
	// ReasonWithinMaxUnhealthy (RemediationPaused False).
	ReasonWithinMaxUnhealthy = "WithinMaxUnhealthy"
)

// Reasons of the Events a ProxyPool or a ProxySource gets about its
// members (services/controller/pkg/memberset).
const (
	// EventMemberCreated: members were created; the message says why.
	EventMemberCreated = "MemberCreated"
	// EventMemberUndrained: a member's drain was taken back (its entry
	// came back to its source); the message says why.
	EventMemberUndrained = "MemberUndrained"
	// EventMemberDraining: a member stopped taking leases and waits for
	// its live ones; the message says why and until when.
	EventMemberDraining = "MemberDraining"
	// EventMemberDeleted: a drained member was deleted; the message says
	// whether its leases ended or the drain timed out.
	EventMemberDeleted = "MemberDeleted"
	// EventScaled: the autoscaler changed spec.replicas; the message
	// gives the figures it decided on.
	EventScaled = "Scaled"
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
	ReasonCleanupFailed: true, ReasonInstanceLost: true, ReasonProbeStale: true, ReasonProbeFailed: true, ReasonProbeDenied: true,
	EventCleanupSkipped: true, ReasonDisruptionBlocked: true, ReasonRetriesExhausted: true, ReasonTooManyUnhealthy: true,
	ReasonFetchFailed: true, ReasonNoValidEntries: true, ReasonShrinkHeld: true,
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
	// LabelProxyCredentials must be "true" on a Secret referenced by
	// spec.credentialsSecretRef; the controller's and the broker's caches
	// hold no others.
	LabelProxyCredentials = "crawl.example.com/proxy-credentials"
	// AnnotationSkipCleanup set to "true" on a Terminating Proxy abandons
	// its instance and releases the object.
	AnnotationSkipCleanup = "crawl.example.com/skip-cleanup"
	// LabelPool names the ProxyPool a Proxy belongs to; the pool also
	// owns it through a controller ownerReference.
	LabelPool = "crawl.example.com/pool"
	// LabelTemplateHash is the hash of the instance-defining part of the
	// pool template (provider, placement, cloudInit, port) a member was
	// made from.
	LabelTemplateHash = "crawl.example.com/pool-template-hash"
	// AnnotationDrainDeadline (RFC 3339) marks a draining Proxy: the
	// broker grants it no new lease and renews none past the deadline.
	// A ProxyPool sets it on members it takes out; anyone may set it on
	// any Proxy.
	AnnotationDrainDeadline = "crawl.example.com/drain-deadline"
	// AnnotationCordoned set to "true" keeps the brokers from granting
	// the Proxy new leases while its live leases run and renew as
	// before; nothing is deleted, and removing it (`kubectl egress
	// uncordon`) makes the proxy leasable again. A drain is a cordon with
	// a deadline and, in a pool, a deletion after it.
	AnnotationCordoned = "crawl.example.com/cordoned"
	// AnnotationReplaces, on a pool member, names the member it was made
	// to replace; AnnotationSlotRetries counts the failed members its slot
	// has been through. The pool writes both.
	AnnotationReplaces    = "crawl.example.com/replaces"
	AnnotationSlotRetries = "crawl.example.com/slot-retries"
	// AnnotationDoNotDisrupt set to "true" keeps a pool from choosing the
	// Proxy for any disruption (scale-down, rollout, rotation,
	// remediation).
	AnnotationDoNotDisrupt = "crawl.example.com/do-not-disrupt"
	// Finalizer guards instance deletion.
	Finalizer = "crawl.example.com/instance-cleanup"
)
