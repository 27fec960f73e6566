package v1alpha1

// Who writes what. Every status field and condition type of these kinds
// has one writer, declared here as services/broker/pkg/store/schema.go
// declares Redis's keys. The writers patch status through
// pkg/statuspatch, which refuses a write outside the writer's
// declaration, and docs/api/status-writers.md's "Who writes what" table is generated
// from this list (make generate), so the code, the check and the docs
// cannot drift apart.

// StatusWriter declares what one writer owns of one kind's status.
//
// +kubebuilder:object:generate=false
type StatusWriter struct {
	// Name is the writer's name, in errors and docs and as the writer
	// label of the controller's status-write counter.
	Name string
	// Kind is the kind whose status it writes.
	Kind string
	// Fields are the status fields it owns, by JSON name; AllFields
	// means the whole status, for a kind with one writer.
	Fields []string
	// Conditions are the condition types it owns; with AllFields, every
	// condition of the kind.
	Conditions []string
	// Who says in words which component it is, for the docs.
	Who string
	// Also says what else it writes that is not status, for the docs.
	Also string
}

// AllFields, as a writer's only field, claims the whole status.
const AllFields = "*"

// Owns reports whether w may write status field f.
func (w StatusWriter) Owns(f string) bool {
	for _, o := range w.Fields {
		if o == f || o == AllFields {
			return true
		}
	}
	return false
}

// OwnsCondition reports whether w may write condition type t.
func (w StatusWriter) OwnsCondition(t string) bool {
	for _, o := range w.Conditions {
		if o == t {
			return true
		}
	}
	return w.Owns(AllFields)
}

// The status writers.
var (
	// WriterLifecycle brings a Proxy's instance to its spec. It says a
	// new instance exists by moving instanceGeneration, which is what
	// makes the health engine start over, so it never writes health.
	WriterLifecycle = StatusWriter{
		Name: "lifecycle", Kind: "Proxy",
		Fields:     []string{"phase", "ip", "port", "providerID", "instanceGeneration", "specHash", "observedGeneration"},
		Conditions: []string{ConditionReady},
		Who:        "the lifecycle reconciler (`services/controller/pkg/controllers/proxy/lifecycle`)",
		Also:       "the finalizer; provider instances (orphan GC deletes what no Proxy owns at its generation)",
	}
	// WriterHealth folds the probers' results into a Proxy's health.
	WriterHealth = StatusWriter{
		Name: "health", Kind: "Proxy",
		Fields:     []string{"healthy", "egressIP", "lastHealthCheckTime", "healthInstanceGeneration"},
		Conditions: []string{ConditionHealthy},
		Who:        "the health engine (`services/controller/pkg/health`)",
	}
	// WriterPool derives a ProxyPool's status from its reconcile's decision.
	WriterPool = StatusWriter{
		Name: "proxypool", Kind: "ProxyPool", Fields: []string{AllFields},
		Who:  "the pool rollout (`services/controller/pkg/controllers/proxypool`)",
		Also: "its members: creates them, syncs attributes, health check and template metadata in place, sets `drain-deadline`, `replaces` and `slot-retries`; with `spec.autoscaling`, `spec.replicas` through `/scale` only",
	}
	// WriterSource derives a ProxySource's status from its read and plan.
	WriterSource = StatusWriter{
		Name: "proxysource", Kind: "ProxySource", Fields: []string{AllFields},
		Who:  "the ProxySource reconciler (`services/controller/pkg/controllers/proxysource`)",
		Also: "its members (creates them, syncs attributes and health check, sets and takes back `drain-deadline`, sets `exits`) and their credentials Secrets",
	}
	// WriterTenant: the broker leading the tenant-status Lease writes
	// each Tenant's status from what every broker recorded in the store.
	WriterTenant = StatusWriter{
		Name: "tenant", Kind: "Tenant", Fields: []string{AllFields},
		Who:  "the broker leading the `<release>-broker-tenant-status` Lease (`services/broker/pkg/access`); every broker records whom it served in Redis",
		Also: "lease state in Redis, in keys declared in `services/broker/pkg/store/schema.go`",
	}
)

// StatusWriters is every status writer, in the docs' order.
var StatusWriters = []StatusWriter{WriterLifecycle, WriterHealth, WriterPool, WriterSource, WriterTenant}

// Observer is a kind whose status says which generation it reflects:
// the writer owning observedGeneration sets it when a reconcile
// succeeded, and only then, so a status never claims a spec it failed
// to act on.
//
// +kubebuilder:object:generate=false
type Observer interface {
	Observe()
}

// Observe records that the status reflects the current generation.
func (p *Proxy) Observe() { p.Status.ObservedGeneration = p.Generation }

// Observe records that the status reflects the current generation.
func (p *ProxyPool) Observe() { p.Status.ObservedGeneration = p.Generation }

// Observe records that the status reflects the current generation.
func (s *ProxySource) Observe() { s.Status.ObservedGeneration = s.Generation }
