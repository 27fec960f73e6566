// Package inventory is the broker's read-only view of the Proxy fleet: an
// informer on Proxy objects feeding an in-memory snapshot. The broker
// writes nothing to Kubernetes.
package inventory

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
)

// Proxy is what the broker needs of one Proxy object.
type Proxy struct {
	// UID names the proxy in the lease store, so a Proxy re-created under
	// the same name starts with no leases and no cooldowns.
	UID       string
	ID        string // namespace/name
	Namespace string
	// Pool is the ProxyPool it belongs to (LabelPool), "" for none.
	Pool       string
	IP         string
	Port       int32
	EgressIP   string
	Attributes map[string]string
	Healthy    bool
	// HealthySince is the last probe success the broker can see (zero
	// while not healthy): when the Healthy condition turned True, or a
	// later success the controller wrote to confirm a quarantined proxy.
	HealthySince time.Time
	// HealthStale: the controller has had no recent probe result for it
	// (Healthy=Unknown, reason ProbeStale).
	HealthStale bool
	Ready       bool
	Deleting    bool
	// DrainDeadline is set while the Proxy is draining (its ProxyPool
	// is taking it out): no new leases, and renewals end at the deadline.
	DrainDeadline time.Time
	// Cordoned: an operator asked for no new leases (AnnotationCordoned);
	// live leases renew as before.
	Cordoned bool
	// Reason is why it takes no new lease (v1alpha1.Proxy.NotLeasable),
	// "" when it is Leasable.
	Reason   string
	Leasable bool
	// CredentialsRef decides the credentials its leases carry
	// (Inventory.Credentials).
	CredentialsRef kube.CredentialsRef
}

// Draining reports whether the proxy takes no new leases.
func (p *Proxy) Draining() bool { return !p.DrainDeadline.IsZero() }

// Addr is ip:port.
func (p *Proxy) Addr() string { return net.JoinHostPort(p.IP, strconv.Itoa(int(p.Port))) }

// NotLeasable says why p is not leasable, as a stable reason (the
// Proxy's, v1alpha1.Proxy.NotLeasable) and a sentence; it returns ""
// when p is leasable.
func (p *Proxy) NotLeasable() (reason, why string) {
	switch p.Reason {
	case v1.NotLeasableDeleting:
		why = "the proxy is being deleted"
	case v1.NotLeasableHealthStale:
		why = "the proxy's health is stale (no recent probe result)"
	case v1.NotLeasableUnhealthy:
		why = "the proxy failed its health checks"
	case v1.NotLeasableNotReady:
		why = "the proxy is not Ready"
	case v1.NotLeasableDraining:
		why = "the proxy is draining: it takes no new leases and renews none past " + p.DrainDeadline.UTC().Format(time.RFC3339)
	case v1.NotLeasableCordoned:
		why = "the proxy is cordoned (" + v1.AnnotationCordoned + "): it takes no new leases; `kubectl egress uncordon` ends that"
	}
	return p.Reason, why
}

// Selected reports whether p is in one of namespaces (any, when nil),
// its attributes contain every selector pair, and its health is healthy
// (any, when nil): what a list, a page and a watch select.
func (p *Proxy) Selected(namespaces []string, selector map[string]string, healthy *bool) bool {
	return p.Matches(namespaces, selector) && (healthy == nil || p.Healthy == *healthy)
}

// Matches reports whether p is in one of namespaces (any, when nil) and
// its attributes contain every selector pair.
func (p *Proxy) Matches(namespaces []string, selector map[string]string) bool {
	if namespaces != nil && !slices.Contains(namespaces, p.Namespace) {
		return false
	}
	for k, v := range selector {
		if p.Attributes[k] != v {
			return false
		}
	}
	return true
}

func fromObject(px *v1.Proxy) Proxy {
	h := meta.FindStatusCondition(px.Status.Conditions, v1.ConditionHealthy)
	drain, _ := px.DrainDeadline()
	reason := px.NotLeasable()
	return Proxy{
		CredentialsRef: kube.CredentialsRefOf(px),
		UID:            string(px.UID), ID: px.Key(), Namespace: px.Namespace, Pool: px.Labels[v1.LabelPool],
		IP: px.Status.IP, Port: px.Status.Port, EgressIP: px.Status.EgressIP,
		Attributes: px.Spec.Attributes, Healthy: px.Status.IsHealthy(),
		HealthStale:  px.HealthStale(),
		HealthySince: healthySince(px.Status.IsHealthy(), h, px.Status.LastHealthCheckTime),
		Ready:        px.IsReady(), Deleting: !px.DeletionTimestamp.IsZero(),
		DrainDeadline: drain, Cordoned: px.Annotations[v1.AnnotationCordoned] == "true",
		Reason: reason, Leasable: reason == "",
	}
}

func healthySince(healthy bool, h *metav1.Condition, checked *metav1.Time) time.Time {
	if !healthy || h == nil || h.Status != metav1.ConditionTrue {
		return time.Time{}
	}
	if checked != nil && checked.After(h.LastTransitionTime.Time) {
		return checked.Time
	}
	return h.LastTransitionTime.Time
}

// Inventory is the snapshot, keyed by UID.
type Inventory struct {
	// Credentials gives leased proxies their credentials as the controller
	// gives them to probes: set its Key before serving; Run sets its
	// Secrets.
	Credentials kube.ProxyCredentials
	mu          sync.RWMutex
	proxies     map[string]Proxy
	// byID is every proxy's ID, sorted: a page of the list starts where
	// the last one ended without sorting the fleet.
	byID    []idUID
	synced  atomic.Bool
	changed []func(uid string)
	cache   cache.Cache
}

// Cache is the informer cache Run started, for other read-only kinds the
// broker watches in the same scope.
func (i *Inventory) Cache() cache.Cache { return i.cache }

// New returns an empty inventory; Run fills it from an informer. changed
// (may be nil) is called after every change with the proxy's UID, to keep
// what is derived from the inventory (the selector indexes) in step.
func New(changed func(uid string)) *Inventory {
	i := &Inventory{proxies: map[string]Proxy{}}
	if changed != nil {
		i.OnChange(changed)
	}
	return i
}

// OnChange adds f to what is called after every change, with the proxy's
// UID, from the change on: a listener added late reads the inventory once
// after adding itself.
func (i *Inventory) OnChange(f func(uid string)) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.changed = append(i.changed, f)
}

func (i *Inventory) notify(uid string) {
	i.mu.RLock()
	fs := i.changed
	i.mu.RUnlock()
	for _, f := range fs {
		f(uid)
	}
}

// Run watches Proxies (in namespace, or all when empty), and with
// readSecrets their credentials Secrets in secretNamespaces (all when
// empty), until ctx ends. It returns once the informer is running;
// Synced turns true after the first full list.
func (i *Inventory) Run(ctx context.Context, cfg *rest.Config, namespace string, secretNamespaces []string, readSecrets bool) error {
	opts := cache.Options{Scheme: kube.NewScheme()}
	if readSecrets {
		// The Secrets proxies name for their credentials, and only those.
		opts.ByObject = kube.CredentialSecrets(secretNamespaces)
	}
	i.Credentials.Namespaces = secretNamespaces
	if namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{namespace: {}}
	}
	c, err := cache.New(cfg, opts)
	if err != nil {
		return fmt.Errorf("creating the Proxy informer: %w", err)
	}
	inf, err := c.GetInformer(ctx, &v1.Proxy{})
	if err != nil {
		return fmt.Errorf("getting the Proxy informer: %w", err)
	}
	if _, err := inf.AddEventHandler(kube.ProxyEvents(
		func(px *v1.Proxy) { i.Set(fromObject(px)) },
		func(px *v1.Proxy) { i.Delete(string(px.UID)) },
	)); err != nil {
		return err
	}
	if readSecrets {
		if _, err := c.GetInformer(ctx, &corev1.Secret{}); err != nil {
			return fmt.Errorf("getting the credentials Secret informer: %w", err)
		}
		i.Credentials.Secrets = c
	}
	i.cache = c
	go func() { _ = c.Start(ctx) }()
	go func() {
		if c.WaitForCacheSync(ctx) {
			i.synced.Store(true)
		}
	}()
	return nil
}

type idUID struct{ id, uid string }

// at is where id sits in byID, or would.
func (i *Inventory) at(id, uid string) int {
	return sort.Search(len(i.byID), func(k int) bool {
		e := i.byID[k]
		return e.id > id || (e.id == id && e.uid >= uid)
	})
}

// Set adds or replaces a proxy.
func (i *Inventory) Set(p Proxy) {
	i.mu.Lock()
	if _, ok := i.proxies[p.UID]; !ok {
		k := i.at(p.ID, p.UID)
		i.byID = slices.Insert(i.byID, k, idUID{p.ID, p.UID})
	}
	i.proxies[p.UID] = p
	i.mu.Unlock()
	i.notify(p.UID)
}

// Delete removes a proxy.
func (i *Inventory) Delete(uid string) {
	i.mu.Lock()
	if p, ok := i.proxies[uid]; ok {
		if k := i.at(p.ID, uid); k < len(i.byID) && i.byID[k].uid == uid {
			i.byID = slices.Delete(i.byID, k, k+1)
		}
		delete(i.proxies, uid)
	}
	i.mu.Unlock()
	i.notify(uid)
}

// Page returns up to limit proxies matching namespaces and selector (and
// health, when healthy is set) whose IDs sort after after, in ID order,
// and whether more match beyond them. It reads only as far as the page
// reaches.
func (i *Inventory) Page(namespaces []string, selector map[string]string, healthy *bool, after string, limit int) ([]Proxy, bool) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	k := sort.Search(len(i.byID), func(k int) bool { return i.byID[k].id > after })
	out := make([]Proxy, 0, min(limit, len(i.byID)-k))
	for ; k < len(i.byID); k++ {
		p := i.proxies[i.byID[k].uid]
		if !p.Selected(namespaces, selector, healthy) {
			continue
		}
		if len(out) == limit {
			return out, true
		}
		out = append(out, p)
	}
	return out, false
}

// Synced reports whether the first full list has arrived.
func (i *Inventory) Synced() bool { return i.synced.Load() }

// Select returns the proxies matching namespaces and selector (and health,
// when healthy is set), sorted by id.
func (i *Inventory) Select(namespaces []string, selector map[string]string, healthy *bool, leasableOnly bool) []Proxy {
	i.mu.RLock()
	out := make([]Proxy, 0, len(i.proxies))
	for _, p := range i.proxies {
		if !p.Selected(namespaces, selector, healthy) || (leasableOnly && !p.Leasable) {
			continue
		}
		out = append(out, p)
	}
	i.mu.RUnlock()
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// ByID returns the proxy named id ("namespace/name"): of a name's two
// incarnations (the old one still being deleted), the new one.
func (i *Inventory) ByID(id string) (Proxy, bool) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	var found Proxy
	ok := false
	for k := i.at(id, ""); k < len(i.byID) && i.byID[k].id == id; k++ {
		if p := i.proxies[i.byID[k].uid]; !ok || found.Deleting {
			found, ok = p, true
		}
	}
	return found, ok
}

// Get returns one proxy by UID.
func (i *Inventory) Get(uid string) (Proxy, bool) {
	i.mu.RLock()
	defer i.mu.RUnlock()
	p, ok := i.proxies[uid]
	return p, ok
}
