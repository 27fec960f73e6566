// Package proxysource reconciles ProxySources: it keeps one External
// Proxy per entry a list, a URL or a vendor's back-connect endpoint names,
// adds what appears, and takes out what disappears the way a ProxyPool
// takes out a member (package drain): no new leases, then deletion once
// its leases end or its drain times out.
//
// A reconcile reads the source (read.go), plans (plan.go, a pure
// function of the entries, the members and their lease counts), then
// executes the plan (execute.go) and derives status (status.go). A read
// that fails or holds no valid entry changes no member; a shrink past
// spec.maxShrinkPercent waits for confirmation. Member names are a hash of
// the entry's identity, so a restarted controller, or one whose cache lags
// its own writes, creates the same names again and gets AlreadyExists.
package proxysource

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/statuspatch"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// Options tune the reconciler; zero values take the defaults.
type Options struct {
	// MarkLag is how long after a drain begins a lease count must have
	// been read to end it (package drain).
	MarkLag time.Duration
	// Egress holds URL fetches, as it holds probes.
	Egress netpolicy.Egress
	// Deny is the proxy-address policy (--probe-deny-cidrs): an entry
	// at an address in it is rejected, not made a member.
	Deny netpolicy.DenyList
	// Meter, when set, counts the bytes probes spend through proxies, for
	// sources with a probe budget.
	Meter Meter
	// SecretNamespaces are where the ConfigMaps and Secrets a source
	// names are read (all when empty): a source elsewhere is told so.
	SecretNamespaces []string
	// Clock is the reconciler's time; nil is the wall clock. Tests step
	// a fake one.
	Clock clock.PassiveClock
}

// Meter counts probe bytes per proxy.
type Meter interface {
	// ProbeBytes is the bytes probes have spent through the proxies ids,
	// and how many probes they were, since the process started.
	ProbeBytes(ids []types.NamespacedName) (bytes, probes int64)
}

// Reconciler keeps ProxySources' members.
type Reconciler struct {
	client   client.Client
	reader   reader
	sources  cache.Cache
	leases   leaseview.Source
	recorder events.EventRecorder
	log      *slog.Logger
	opts     Options

	mu sync.Mutex
	// fetched holds each URL source's last fetch, so member changes do
	// not fetch again before the refresh interval.
	fetched map[types.NamespacedName]fetch
	// spent is each metered source's probe count as last read.
	spent map[types.NamespacedName]spent
}

// fetch is a URL source's last read, and what it was read for.
type fetch struct {
	sourceRead
	uid        types.UID
	generation int64
	refresh    string
}

// New returns a reconciler writing through c, reading the labelled
// ConfigMaps and Secrets a source names from sources, and learning live
// leases from leases.
func New(c client.Client, sources cache.Cache, leases leaseview.Source, recorder events.EventRecorder, log *slog.Logger, opts Options) *Reconciler {
	if opts.MarkLag == 0 {
		opts.MarkLag = memberset.DefaultMarkLag
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	return &Reconciler{client: c, reader: reader{cache: sources, egress: opts.Egress, deny: opts.Deny, namespaces: opts.SecretNamespaces}, sources: sources, leases: leases,
		recorder: recorder, log: log, opts: opts, fetched: map[types.NamespacedName]fetch{}, spent: map[types.NamespacedName]spent{}}
}

// SetupWithManager registers the reconciler.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	refs := handler.EnqueueRequestsFromMapFunc(r.referencing)
	return ctrl.NewControllerManagedBy(mgr).
		Named("proxysource").
		// Annotations too: confirm-shrink is one.
		For(&v1.ProxySource{}, builder.WithPredicates(predicate.Or(predicate.GenerationChangedPredicate{}, predicate.AnnotationChangedPredicate{}))).
		Owns(&v1.Proxy{}).
		WatchesRawSource(source.Kind(r.sources, client.Object(&corev1.ConfigMap{}), refs)).
		WatchesRawSource(source.Kind(r.sources, client.Object(&corev1.Secret{}), refs)).
		// A URL source's fetch holds its worker up to spec.url.timeout.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(r)
}

// referencing maps a ConfigMap or Secret to the sources of its namespace
// that name it.
func (r *Reconciler) referencing(ctx context.Context, o client.Object) []reconcile.Request {
	var list v1.ProxySourceList
	if err := r.client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	_, secret := o.(*corev1.Secret)
	var out []reconcile.Request
	for i := range list.Items {
		if names(&list.Items[i].Spec, secret)[o.GetName()] {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

// names are the Secrets (secret) or ConfigMaps a spec reads.
func names(s *v1.ProxySourceSpec, secret bool) map[string]bool {
	out := map[string]bool{}
	add := func(ok bool, name string) {
		if ok {
			out[name] = true
		}
	}
	if l := s.List; l != nil {
		add(!secret && l.ConfigMapRef != nil, refName(l.ConfigMapRef))
		add(secret && l.SecretRef != nil, refName(l.SecretRef))
	}
	if u := s.URL; u != nil && secret {
		add(u.CASecretRef != nil, refName(u.CASecretRef))
		add(u.AuthSecretRef != nil, localName(u.AuthSecretRef))
	}
	if v := s.Vendor; v != nil && secret {
		out[v.PasswordSecretRef.Name] = true
	}
	return out
}

func refName(r *v1.KeyRef) string {
	if r == nil {
		return ""
	}
	return r.Name
}

func localName(r *v1.LocalSecretRef) string {
	if r == nil {
		return ""
	}
	return r.Name
}

// Reconcile is the fixed skeleton: fetch, deferred status patch, then
// reconcileNormal. A source has no finalizer: its members and their
// credential Secrets carry its ownerReference, so deleting it has the
// garbage collector delete them.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (res ctrl.Result, retErr error) {
	src := &v1.ProxySource{}
	if err := r.client.Get(ctx, req.NamespacedName, src); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
		}
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !src.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	base := src.DeepCopy()
	defer func() {
		statuspatch.New(v1.WriterSource, r.client).Deferred(ctx, base, src, &res, &retErr)
	}()
	return r.reconcileNormal(ctx, src)
}

// forget drops what the reconciler remembers of a deleted source.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.fetched, key)
	delete(r.spent, key)
}

// reconcileNormal reads, plans, executes and derives status.
func (r *Reconciler) reconcileNormal(ctx context.Context, src *v1.ProxySource) (ctrl.Result, error) {
	now := r.opts.Clock.Now()
	rd := r.read(ctx, src, now)
	var desired map[string]Entry
	switch {
	case rd.err != nil:
	case len(rd.parsed.entries) == 0 && rd.parsed.Rejected() > 0:
		// Garbage: applying it would empty the source.
	default:
		desired = withAttributes(src, rd.parsed.entries)
	}
	snap := r.leases.Snapshot()
	members, proxies, err := r.observe(ctx, src, snap)
	if err != nil {
		return ctrl.Result{}, err
	}
	l := resolve(src, r.opts.MarkLag)
	p := decide(l, desired, members, snap.At, now)
	interval := r.meter(src, proxies, now)
	if len(p.create)+len(p.drain)+len(p.undrain)+len(p.delete) > 0 {
		r.log.DebugContext(ctx, "executing", "source", client.ObjectKeyFromObject(src), "create", len(p.create), "drain", p.drain, "undrain", p.undrain, "delete", p.delete)
	}
	execErr := r.execute(ctx, src, l, desired, proxies, p, interval, now)
	was := ""
	if c := meta.FindStatusCondition(src.Status.Conditions, v1.ConditionSynced); c != nil {
		was = c.Reason
	}
	setStatus(src, rd, desired, proxies, p)
	// Someone has to act on a read that stopped applying: said once, when
	// it begins.
	if c := meta.FindStatusCondition(src.Status.Conditions, v1.ConditionSynced); c.Status == metav1.ConditionFalse && c.Reason != was {
		r.recorder.Eventf(src, nil, v1.EventType(c.Reason), c.Reason, "Sync", "%s", c.Message)
	}
	next := rd.again
	for _, m := range members {
		if m.draining() {
			next = minPositive(next, memberset.NextDrainCheck(m.deadline, l.drainTimeout, l.markLag, now))
		}
	}
	if len(p.drain) > 0 {
		next = minPositive(next, l.markLag)
	}
	if p.pending > 0 {
		next = minPositive(next, time.Second)
	}
	if src.Spec.ProbeBudget != nil {
		next = minPositive(next, meterEvery)
	}
	return ctrl.Result{RequeueAfter: next}, execErr
}

func minPositive(a, b time.Duration) time.Duration {
	if a <= 0 || (b > 0 && b < a) {
		return b
	}
	return a
}

// resolve reads the spec's limits and the confirmation annotation.
func resolve(src *v1.ProxySource, markLag time.Duration) limits {
	l := limits{drainTimeout: 10 * time.Minute, markLag: markLag, maxShrinkPercent: 50, confirmed: -1}
	if d := src.Spec.DrainTimeout; d != nil {
		l.drainTimeout = d.Duration
	}
	if m := src.Spec.MaxShrinkPercent; m != nil {
		l.maxShrinkPercent = int(*m)
	}
	if v, ok := src.Annotations[v1.AnnotationConfirmShrink]; ok {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			l.confirmed = n
		}
	}
	return l
}

// sourceRead is one read of a source: its entries, or why there are
// none; when it was read; and, for a URL, how soon to fetch again.
type sourceRead struct {
	parsed parsed
	err    error
	at     time.Time
	again  time.Duration
}

// read is the source's entries: a URL source's last fetch until its
// refresh interval, its spec or its refresh annotation says to fetch
// again; any other source read now, from the cache.
func (r *Reconciler) read(ctx context.Context, src *v1.ProxySource, now time.Time) sourceRead {
	u := src.Spec.URL
	if u == nil {
		p, err := r.reader.read(ctx, src)
		return sourceRead{parsed: p, err: err, at: now}
	}
	refresh := defaultRefresh
	if u.RefreshInterval != nil && u.RefreshInterval.Duration > 0 {
		refresh = u.RefreshInterval.Duration
	}
	key := client.ObjectKeyFromObject(src)
	r.mu.Lock()
	f, ok := r.fetched[key]
	r.mu.Unlock()
	asked := src.Annotations[v1.AnnotationRefresh]
	if !ok || f.uid != src.UID || f.generation != src.Generation || f.refresh != asked || now.Sub(f.at) >= refresh {
		p, err := r.reader.read(ctx, src)
		f = fetch{sourceRead: sourceRead{parsed: p, err: err, at: now}, uid: src.UID, generation: src.Generation, refresh: asked}
		r.mu.Lock()
		r.fetched[key] = f
		r.mu.Unlock()
	}
	rd := f.sourceRead
	rd.again = max(f.at.Add(refresh).Sub(now), time.Second)
	return rd
}

// withAttributes gives every entry the source's attributes over its own
// (a vendor session's country, a JSON entry's): the spec is written by
// whoever may edit the source, the entries by whoever serves the list,
// and a Tenant's selector must not be claimable from a list.
func withAttributes(src *v1.ProxySource, entries map[string]Entry) map[string]Entry {
	out := make(map[string]Entry, len(entries))
	for id, e := range entries {
		if len(src.Spec.Attributes) > 0 {
			attrs := make(map[string]string, len(src.Spec.Attributes)+len(e.Attributes))
			maps.Copy(attrs, e.Attributes)
			maps.Copy(attrs, src.Spec.Attributes)
			e.Attributes = attrs
		}
		out[id] = e
	}
	return out
}

// observe reads the source's members from the cache, with the live-lease
// counts of snap.
func (r *Reconciler) observe(ctx context.Context, src *v1.ProxySource, snap leaseview.Snapshot) ([]*member, map[string]*v1.Proxy, error) {
	proxies, _, err := memberset.Members(ctx, r.client, src, client.MatchingLabels{v1.LabelSource: src.Name})
	if err != nil {
		return nil, nil, err
	}
	var members []*member
	for _, px := range proxies {
		m := &member{name: px.Name, identity: px.Annotations[v1.AnnotationSourceEntry], deleting: !px.DeletionTimestamp.IsZero(),
			leases: snap.Leases[px.Key()]}
		m.deadline, _ = px.DrainDeadline()
		members = append(members, m)
	}
	slices.SortFunc(members, func(a, b *member) int { return strings.Compare(a.name, b.name) })
	return members, proxies, nil
}
