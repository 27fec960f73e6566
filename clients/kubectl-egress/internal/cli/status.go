package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// fleet is the cluster's Proxies and ProxyPools in scope, and what the
// brokers say of each proxy.
type fleet struct {
	pools   []v1.ProxyPool
	proxies []v1.Proxy
	// brokers holds the lease API's view by proxy id; nil when it could
	// not be read (apiErr says why): the rest still shows.
	brokers map[string]*leasev1.Proxy
	apiErr  error
}

func (e *env) readFleet(ctx context.Context) (*fleet, error) {
	f := &fleet{}
	var pools v1.ProxyPoolList
	var proxies v1.ProxyList
	if err := e.kube.List(ctx, &pools, client.InNamespace(e.scope())); err != nil {
		return nil, fmt.Errorf("listing ProxyPools: %w", err)
	}
	if err := e.kube.List(ctx, &proxies, client.InNamespace(e.scope())); err != nil {
		return nil, fmt.Errorf("listing Proxies: %w", err)
	}
	f.pools, f.proxies = pools.Items, proxies.Items
	f.brokers, f.apiErr = e.brokerView(ctx)
	return f, nil
}

// brokerView pages through ListProxies for the scope.
func (e *env) brokerView(ctx context.Context) (map[string]*leasev1.Proxy, error) {
	api, done, err := e.leaseAPI(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	out := map[string]*leasev1.Proxy{}
	req := &leasev1.ListProxiesRequest{Namespace: e.scope()}
	for {
		resp, err := api.ListProxies(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("ListProxies: %w", err)
		}
		for _, p := range resp.GetProxies() {
			out[p.GetId()] = p
		}
		if resp.GetNextPageToken() == "" {
			return out, nil
		}
		req.PageToken = resp.GetNextPageToken()
	}
}

// memberState is one proxy's line in status.
type memberState struct {
	ID          string `json:"id"`
	Pool        string `json:"pool,omitempty"`
	Phase       string `json:"phase"`
	Ready       bool   `json:"ready"`
	Healthy     bool   `json:"healthy"`
	EgressIP    string `json:"egressIP,omitempty"`
	Leases      int32  `json:"leases"`
	Leasable    bool   `json:"leasable"`
	Reason      string `json:"reason,omitempty"`
	Why         string `json:"why,omitempty"`
	Draining    bool   `json:"draining,omitempty"`
	Cordoned    bool   `json:"cordoned,omitempty"`
	Quarantined bool   `json:"quarantined,omitempty"`
}

// poolState is one pool's (or the pool-less proxies') summary.
type poolState struct {
	Name        string        `json:"name"`
	Desired     *int32        `json:"desired,omitempty"`
	Proxies     int           `json:"proxies"`
	Ready       int           `json:"ready"`
	Healthy     int           `json:"healthy"`
	Leasable    int           `json:"leasable"`
	Leased      int           `json:"leased"`
	Leases      int32         `json:"leases"`
	Quarantined int           `json:"quarantined"`
	Draining    int           `json:"draining"`
	Cordoned    int           `json:"cordoned"`
	Condition   string        `json:"condition,omitempty"`
	NotLeasable []memberState `json:"notLeasable,omitempty"`
	members     []memberState
}

// statusView is what status prints.
type statusView struct {
	Pools []*poolState `json:"pools"`
	// Brokers is empty when the lease API answered, else why not.
	Brokers string `json:"brokers,omitempty"`
}

// noPool groups the proxies no pool owns.
const noPool = "(no pool)"

func (f *fleet) view(now time.Time) *statusView {
	v := &statusView{}
	if f.apiErr != nil {
		v.Brokers = f.apiErr.Error()
	}
	byName := map[string]*poolState{}
	group := func(ns, name string) *poolState {
		key := ns + "/" + name
		if name == noPool {
			key = noPool
		}
		if p, ok := byName[key]; ok {
			return p
		}
		p := &poolState{Name: key}
		byName[key] = p
		v.Pools = append(v.Pools, p)
		return p
	}
	for i := range f.pools {
		p := &f.pools[i]
		g := group(p.Namespace, p.Name)
		g.Desired = p.Spec.Replicas
		if c := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionReady); c != nil {
			g.Condition = c.Reason + ": " + c.Message
		}
	}
	for i := range f.proxies {
		px := &f.proxies[i]
		name := px.Labels[v1.LabelPool]
		if name == "" {
			name = noPool
		}
		g := group(px.Namespace, name)
		m := f.member(px, now)
		m.Pool = g.Name
		g.members = append(g.members, m)
		g.Proxies++
		g.Ready += b2i(m.Ready)
		g.Healthy += b2i(m.Healthy)
		g.Leasable += b2i(m.Leasable)
		g.Leased += b2i(m.Leases > 0)
		g.Leases += m.Leases
		g.Quarantined += b2i(m.Quarantined)
		g.Draining += b2i(m.Draining)
		g.Cordoned += b2i(m.Cordoned)
		if !m.Leasable {
			g.NotLeasable = append(g.NotLeasable, m)
		}
	}
	sort.Slice(v.Pools, func(a, b int) bool { return v.Pools[a].Name < v.Pools[b].Name })
	return v
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Reasons status adds to the brokers' (v1alpha1's NotLeasable): the
// brokers' own quarantine, and a Proxy they do not list.
const (
	reasonQuarantined = "PROXY_QUARANTINED"
	reasonUnknown     = "PROXY_UNKNOWN"
)

// member says what a proxy is and, when it takes no new lease, why, in
// one line: the brokers' reason, told with the cluster's detail.
func (f *fleet) member(px *v1.Proxy, now time.Time) memberState {
	m := memberState{ID: px.Key(), Phase: string(px.Status.Phase), EgressIP: px.Status.EgressIP,
		Ready: meta.IsStatusConditionTrue(px.Status.Conditions, v1.ConditionReady), Healthy: px.Status.IsHealthy(),
		Cordoned: px.Annotations[v1.AnnotationCordoned] == "true"}
	deadline, draining := px.DrainDeadline()
	m.Draining = draining
	var b *leasev1.Proxy
	if f.brokers != nil {
		b = f.brokers[m.ID]
	}
	if b != nil {
		m.Leases = b.GetLeaseCount()
		m.Reason = b.GetNotLeasable()
		if q := b.GetQuarantinedUntil(); q != nil && q.AsTime().After(now) {
			m.Quarantined = true
			if m.Reason == "" {
				m.Reason = reasonQuarantined
			}
		}
	} else if f.brokers != nil {
		m.Reason = reasonUnknown
	} else {
		m.Reason = px.NotLeasable() // the cluster's side of the brokers' reason
	}
	m.Leasable = m.Reason == ""
	switch m.Reason {
	case "":
	case v1.NotLeasableUnhealthy, v1.NotLeasableHealthStale:
		m.Why = condition(px, v1.ConditionHealthy, "its probes fail")
	case v1.NotLeasableNotReady:
		m.Why = condition(px, v1.ConditionReady, "it is not Ready")
	case v1.NotLeasableDeleting:
		m.Why = "it is being deleted"
	case v1.NotLeasableDraining:
		m.Why = "draining until " + deadline.UTC().Format(time.RFC3339) + " (" + ago(deadline, now) + "): no new lease; then its pool deletes it"
	case v1.NotLeasableCordoned:
		m.Why = "cordoned: no new lease; `kubectl egress uncordon " + px.Name + " -n " + px.Namespace + "` ends it"
	case reasonQuarantined:
		m.Why = "quarantined until " + ago(b.GetQuarantinedUntil().AsTime(), now) + " after error reports on several targets; its next probe success ends it (`kubectl egress explain " + px.Name + "` says who reported)"
	case reasonUnknown:
		m.Why = "the brokers do not list it (yet)"
	}
	return m
}

func condition(px *v1.Proxy, typ, fallback string) string {
	c := meta.FindStatusCondition(px.Status.Conditions, typ)
	if c == nil || c.Message == "" {
		return fallback
	}
	return c.Reason + ": " + c.Message
}

func (e *env) statusCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status [pool|proxy]",
		Short: "The fleet, one pool or one proxy at a glance, and why anything is not leasable",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if len(args) == 1 {
				return e.statusOf(ctx, args[0])
			}
			f, err := e.readFleet(ctx)
			if err != nil {
				return err
			}
			v := f.view(time.Now())
			return e.emit(v, func(w io.Writer) {
				row(w, "POOL", "DESIRED", "PROXIES", "READY", "HEALTHY", "LEASABLE", "LEASED", "LEASES", "QUARANTINED", "DRAINING", "CORDONED")
				for _, p := range v.Pools {
					desired := "-"
					if p.Desired != nil {
						desired = fmt.Sprint(*p.Desired)
					}
					row(w, p.Name, desired, p.Proxies, p.Ready, p.Healthy, p.Leasable, p.Leased, p.Leases, p.Quarantined, p.Draining, p.Cordoned)
				}
				e.notLeasable(w, v)
			})
		},
	}
	return e.outputFlag(cmd)
}

// notLeasable prints each proxy that takes no new lease, and why.
func (e *env) notLeasable(w io.Writer, v *statusView) {
	if v.Brokers != "" {
		row(w, "")
		row(w, "the brokers could not be asked ("+v.Brokers+"): leases and quarantines are missing, and reasons come from the cluster alone")
	}
	first := true
	for _, p := range v.Pools {
		for _, m := range p.NotLeasable {
			if first {
				row(w, "")
				row(w, "NOT LEASABLE", "REASON", "WHY")
				first = false
			}
			row(w, m.ID, m.Reason, m.Why)
		}
	}
}

// statusOf prints one pool's members, or one proxy's story.
func (e *env) statusOf(ctx context.Context, name string) error {
	ns := e.namespace
	var pool v1.ProxyPool
	err := e.kube.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pool)
	if apierrors.IsNotFound(err) {
		return e.explain(ctx, name)
	}
	if err != nil {
		return fmt.Errorf("reading ProxyPool %s/%s: %w", ns, name, err)
	}
	f, err := e.readFleet(ctx)
	if err != nil {
		return err
	}
	v := f.view(time.Now())
	var g *poolState
	for _, p := range v.Pools {
		if p.Name == ns+"/"+name {
			g = p
		}
	}
	if g == nil {
		g = &poolState{Name: ns + "/" + name, Desired: pool.Spec.Replicas}
	}
	view := struct {
		*poolState
		Members      []memberState      `json:"members"`
		RolloutAfter *metav1.Time       `json:"rolloutAfter,omitempty"`
		Conditions   []metav1.Condition `json:"conditions,omitempty"`
	}{g, g.members, pool.Spec.RolloutAfter, pool.Status.Conditions}
	return e.emit(view, func(w io.Writer) {
		desired := int32(1)
		if g.Desired != nil {
			desired = *g.Desired
		}
		row(w, "POOL", g.Name, fmt.Sprintf("%d desired, %d proxies, %d ready, %d healthy, %d leasable, %d leases", desired, g.Proxies, g.Ready, g.Healthy, g.Leasable, g.Leases))
		// Its rollout, remediation and autoscaling, as the pool says them.
		for _, c := range pool.Status.Conditions {
			row(w, strings.ToUpper(c.Type), string(c.Status)+" "+c.Reason+": "+c.Message)
		}
		if ra := pool.Spec.RolloutAfter; ra != nil {
			row(w, "ROLLOUT AFTER", ra.UTC().Format(time.RFC3339))
		}
		row(w, "")
		row(w, "MEMBER", "PHASE", "HEALTHY", "EGRESS IP", "LEASES", "LEASABLE", "WHY NOT")
		for _, m := range g.members {
			row(w, m.ID, dash(m.Phase), m.Healthy, dash(m.EgressIP), m.Leases, m.Leasable, dash(m.Why))
		}
	})
}
