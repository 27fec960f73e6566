// Package tenant is who may use the broker and how much: each bearer
// token belongs to a tenant, which names the namespaces and attributes
// of the proxies it may see, the verbs it may use and its quotas. Tenants
// come from Tenant objects (their credentials in Secrets) and from the
// token file, whose every line is a tenant of its own name with every
// namespace and verb: the bootstrap, and the way a single-team install
// keeps working unchanged.
//
// The broker enforces a tenant in one place per concern: the verb of
// every call where its transport takes it (Registry.Verify for gRPC and
// REST, Registry.Gateway for the proxy gateway), the namespaces and
// selector of every request in the service (Tenant.Scope), and the
// ownership of leases in the store's scripts.
package access

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
)

// Verb is one thing a tenant may do (v1alpha1.TenantVerb).
type Verb = v1.TenantVerb

// Verbs, as in a Tenant's spec.
const (
	List    = v1.VerbList
	Watch   = v1.VerbWatch
	Lease   = v1.VerbLease
	Report  = v1.VerbReport
	Gateway = v1.VerbGateway
	Inspect = v1.VerbInspect
)

// allVerbs are the token file's tenants'.
var allVerbs = []Verb{List, Watch, Lease, Report, Gateway, Inspect}

// gatewayVerbs are a gateway-scoped token line's (scope=gateway, or the
// gateway token file): tunnels through the gateway, and reports on what
// its own tunnels saw, by lease or session over the API. A crawler behind
// a proxy URL can say a site banned its exit; the password in that URL
// can neither lease (leases carry proxies' credentials) nor list.
var gatewayVerbs = []Verb{Gateway, Report}

// defaultVerbs are a Tenant's that names none: the API, not the gateway.
var defaultVerbs = []Verb{List, Watch, Lease, Report}

// Quotas bound one tenant; 0 is the broker's flag of the same purpose
// (GatewayBytesPerDay has none: 0 is no cap).
type Quotas struct {
	MaxLeases, LeasesPerMinute, ReportsPerSecond, MaxTunnels, MaxWatches, MaxSelectors int
	GatewayBytesPerDay                                                                 int64
}

// Limit is one quota a tenant is held to, and where it is set, for
// refusals to name.
type Limit struct {
	N      int
	Source string
}

// LimitOf is a tenant's quota: its Tenant's (set, spec.quotas.field)
// when it sets one, else the broker's flag's.
func LimitOf(set int, field string, flagValue int, flag string) Limit {
	if set > 0 {
		return Limit{set, "its Tenant's spec.quotas." + field}
	}
	return Limit{flagValue, flag}
}

// Tenant is one holder of credentials, as the broker enforces it.
type Tenant struct {
	// Name says who calls in logs, metrics and refusals, and keys the
	// tenant's leases, request ids, sessions and counts.
	Name string
	// Namespaces are where its proxies are, sorted; nil is every one.
	Namespaces []string
	// Selector holds the attributes every proxy it sees carries.
	Selector map[string]string
	// Verbs are what it may do, sorted.
	Verbs   []Verb
	Quotas  Quotas
	Trusted bool
	// Source says where it was declared, for messages: "Tenant ns/name"
	// or "the token file".
	Source string
}

// Open is the tenant of every call when the broker has no credentials
// configured: everything, unnamed.
var Open = &Tenant{Verbs: allVerbs, Trusted: true}

// fromFile is the tenant of one token-file line.
func fromFile(h auth.Holder) *Tenant {
	t := &Tenant{Name: h.Name, Verbs: allVerbs, Trusted: true, Source: "the token file"}
	if h.GatewayOnly {
		t.Verbs = gatewayVerbs
	}
	return t
}

// FromObject is the tenant a Tenant object declares.
func FromObject(o *v1.Tenant) *Tenant {
	t := &Tenant{Name: o.Name, Selector: o.Spec.Selector, Trusted: o.Spec.Trusted, Source: "Tenant " + o.Namespace + "/" + o.Name,
		Verbs: slices.Sorted(slices.Values(o.Spec.Verbs))}
	if len(t.Verbs) == 0 {
		t.Verbs = defaultVerbs
	}
	if !slices.Contains(o.Spec.Namespaces, v1.AllNamespaces) {
		t.Namespaces = slices.Sorted(slices.Values(o.Spec.Namespaces))
	}
	q := o.Spec.Quotas
	t.Quotas = Quotas{MaxLeases: deref(q.MaxLeases), LeasesPerMinute: deref(q.LeasesPerMinute), ReportsPerSecond: deref(q.ReportsPerSecond),
		MaxTunnels: deref(q.MaxTunnels), MaxWatches: deref(q.MaxWatches), MaxSelectors: deref(q.MaxSelectors)}
	if q.GatewayBytesPerDay != nil {
		t.Quotas.GatewayBytesPerDay = q.GatewayBytesPerDay.Value()
	}
	return t
}

func deref(p *int32) int {
	if p == nil {
		return 0
	}
	return int(*p)
}

// Can reports whether t may use verb.
func (t *Tenant) Can(v Verb) bool { return slices.Contains(t.Verbs, v) }

// ErrorDomain is the domain of the refusals' ErrorInfo.
const ErrorDomain = "egress-proxies.broker"

// Denied is a PERMISSION_DENIED naming what t may not do and its scope,
// with reason (TENANT_VERB, TENANT_NAMESPACE, TENANT_SELECTOR,
// TENANT_LEASE) in an ErrorInfo.
func (t *Tenant) Denied(reason, format string, args ...any) error {
	st := status.New(codes.PermissionDenied, fmt.Sprintf("tenant %q (%s): ", t.Name, t.Source)+fmt.Sprintf(format, args...))
	st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain, Metadata: map[string]string{"tenant": t.Name}})
	return st.Err()
}

// Allow says whether t may use verb.
func (t *Tenant) Allow(v Verb) error {
	if t.Can(v) {
		return nil
	}
	if t.Can(Gateway) && !t.Can(List) && !t.Can(Lease) {
		return t.Denied("TENANT_VERB", "its credentials are for the proxy gateway (verbs: %s): they cannot %s over the lease API", joinVerbs(t.Verbs), v)
	}
	return t.Denied("TENANT_VERB", "may not %s (its verbs: %s)", v, joinVerbs(t.Verbs))
}

func joinVerbs(vs []Verb) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// Scope narrows a request to t: the namespaces it may use (the one it
// named, else all of t's; nil: every namespace) and its selector with t's
// attributes added. A namespace or attribute outside t is refused, naming
// t's scope.
func (t *Tenant) Scope(namespace string, selector map[string]string) ([]string, map[string]string, error) {
	var ns []string
	switch {
	case namespace != "" && t.Namespaces != nil && !slices.Contains(t.Namespaces, namespace):
		return nil, nil, t.Denied("TENANT_NAMESPACE", "namespace %q is outside its namespaces (%s)", namespace, strings.Join(t.Namespaces, ", "))
	case namespace != "":
		ns = []string{namespace}
	default:
		ns = t.Namespaces
	}
	if len(t.Selector) == 0 {
		return ns, selector, nil
	}
	keys := slices.Sorted(maps.Keys(t.Selector))
	for _, k := range keys {
		if v, ok := selector[k]; ok && v != t.Selector[k] {
			return nil, nil, t.Denied("TENANT_SELECTOR", "selector %s=%q is outside its selector (%s)", k, v, t.selector())
		}
	}
	out := make(map[string]string, len(selector)+len(t.Selector))
	maps.Copy(out, selector)
	maps.Copy(out, t.Selector)
	return ns, out, nil
}

func (t *Tenant) selector() string {
	s := make([]string, 0, len(t.Selector))
	for k, v := range t.Selector {
		s = append(s, k+"="+v)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// Sees reports whether a proxy in namespace is in t's namespaces.
func (t *Tenant) Sees(namespace string) bool {
	return t.Namespaces == nil || slices.Contains(t.Namespaces, namespace)
}

// Scoped is a key (a request id, a session key) as the store keeps it:
// each tenant's apart, so one can neither take nor report on another's
// by sending the same key ('/' is not allowed in one).
func (t *Tenant) Scoped(k string) string {
	if k == "" || t.Name == "" {
		return k
	}
	return t.Name + "/" + k
}

// SeesAll reports whether every one of namespaces (nil: every namespace)
// is in t's.
func (t *Tenant) SeesAll(namespaces []string) bool {
	if t.Namespaces == nil {
		return true
	}
	if namespaces == nil {
		return false
	}
	for _, ns := range namespaces {
		if !t.Sees(ns) {
			return false
		}
	}
	return true
}
