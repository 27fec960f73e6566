// Package providers is the contract between the reconciler and the compute
// backends that run Managed proxies. Several rules of the contract cannot be
// expressed in Go types and are enforced by the callers (the reconciler and
// orphan GC); they are stated on each method. docs/provider-contract.md is
// the long form.
package providers

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
)

// Provider runs instances for one providers-config entry.
//
// Every method must be safe for concurrent use; the reconciler calls it for
// many Proxies at once.
type Provider interface {
	// Create starts the instance described by req and returns as soon as
	// the backend has accepted it (fire-and-forget where the backend
	// allows; the reconciler polls Get for progress).
	//
	// Create is idempotent on req.Name: if an instance of that name owned
	// by req.Owner.UID already exists, Create returns it and no error. The
	// reconciler relies on this after a crash between Create and the
	// status write. An instance of that name with another owner is an
	// error, never adopted.
	//
	// Create validates req before any backend call: a missing or unknown
	// placement field is an InvalidConfigError naming the field.
	// Exhausted quota or capacity is a QuotaError.
	Create(ctx context.Context, req *CreateRequest) (*Instance, error)

	// Get returns the instance with this providerID. It returns a
	// NotFoundError only when the instance is really gone; an unreachable
	// backend, a timeout or a permission problem is any other error. The
	// reconciler creates a replacement on NotFound, so a false NotFound
	// duplicates an instance.
	Get(ctx context.Context, providerID string) (*Instance, error)

	// Delete starts deleting the instance and returns; the reconciler polls
	// Get until it reports NotFound. Deleting an instance that is already
	// gone returns nil.
	Delete(ctx context.Context, providerID string) error

	// List returns every instance that carries this entry's ownership tags,
	// with Owner and CreatedAt read back from the backend (orphan GC
	// depends on both). Untagged instances are never returned.
	//
	// When part of the backend cannot be read (an unreachable host), List
	// returns what it could read together with an error; it never reports
	// instances on an unreadable part as absent.
	List(ctx context.Context) ([]*Instance, error)
}

// CreateRequest describes one instance.
type CreateRequest struct {
	// Name is deterministic per Proxy and instance generation
	// (InstanceName), so a retried create names the same instance.
	Name string
	// Owner ties the instance to its Proxy; the provider stores it as tags.
	Owner Owner
	// Placement from the Proxy's spec.
	Placement v1.Placement
	// CloudInit is the resolved user-data (inline, or the Secret's key).
	CloudInit []byte
	// Port the proxy must listen on.
	Port int32
	// Credentials the instance must ask every client for (Basic
	// Proxy-Authorization), so it is no open proxy; empty asks for none.
	// The cloud-init already holds them where it asked for them.
	Credentials proxyauth.Credentials
}

// Owner identifies the Proxy an instance belongs to.
type Owner struct {
	UID       types.UID
	Namespace string
	Name      string
	// Generation is the Proxy's status.instanceGeneration the instance was
	// created for.
	Generation int64
}

// Key is the owner's "namespace/name", as Proxy.Key.
func (o Owner) Key() string {
	return types.NamespacedName{Namespace: o.Namespace, Name: o.Name}.String()
}

// InstanceState is the coarse lifecycle state the reconciler acts on.
type InstanceState string

const (
	// StatePending: accepted, booting, or without an address yet.
	StatePending InstanceState = "Pending"
	// StateRunning: up with an address.
	StateRunning InstanceState = "Running"
	// StateTerminating: being deleted.
	StateTerminating InstanceState = "Terminating"
	// StateFailed: stopped for good (a crashed pod, a stopped VM); the
	// reconciler deletes and recreates it.
	StateFailed InstanceState = "Failed"
)

// Instance is what a provider reports about one instance.
type Instance struct {
	// ProviderID is self-contained: Get and Delete need nothing else to
	// find the instance (e.g. gcp://project/zone/name).
	ProviderID string
	Name       string
	State      InstanceState
	// IP clients connect to; empty until known.
	IP string
	// CreatedAt is read back from the backend, never the caller's clock.
	CreatedAt time.Time
	Owner     Owner
}

// Ready reports whether clients can use the instance.
func (i *Instance) Ready() bool { return i.State == StateRunning && i.IP != "" }
