package access

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/auth"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// verbOf is the verb each LeaseService method needs. A LeaseService
// method missing here is refused to everyone: a new method is closed
// until it is given a verb.
var verbOf = map[string]Verb{
	leasev1.LeaseService_ListProxies_FullMethodName:   List,
	leasev1.LeaseService_ListRefusals_FullMethodName:  List,
	leasev1.LeaseService_ListLeases_FullMethodName:    List,
	leasev1.LeaseService_ExplainProxy_FullMethodName:  List,
	leasev1.LeaseService_ExplainTarget_FullMethodName: List,
	leasev1.LeaseService_WatchProxies_FullMethodName:  Watch,
	leasev1.LeaseService_CreateLease_FullMethodName:   Lease,
	leasev1.LeaseService_RenewLease_FullMethodName:    Lease,
	leasev1.LeaseService_ReleaseLease_FullMethodName:  Lease,
	leasev1.LeaseService_ReportLease_FullMethodName:   Report,
	leasev1.LeaseService_ReportSession_FullMethodName: Report,
}

var leaseService = "/" + leasev1.LeaseService_ServiceDesc.ServiceName + "/"

// DefaultReread is how often the credentials Secrets are read again: how
// long a rotated or removed credential takes to count.
const DefaultReread = 5 * time.Second

// Registry finds the tenant of a bearer token among the token file's
// lines and the Tenant objects' credentials; it is the broker's
// auth.Verifier.
type Registry struct {
	// File is the token file (nil: none).
	File *auth.Token
	Log  *slog.Logger
	// Grace is how long a credential whose Secret cannot be read (for a
	// reason that may pass) keeps its token as last read; after it the
	// credential is refused until it is read. 0 is DefaultGrace.
	Grace time.Duration
	// Clock times the grace; nil is the wall clock.
	Clock clock.PassiveClock
	// unreadable is since when each credential's read has failed (by
	// credentialKey); only read touches it.
	unreadable map[string]time.Time

	snap atomic.Pointer[snapshot]
	// watching: Tenants are read, so calls need a credential even while
	// none is declared.
	watching atomic.Bool
	// files caches the token file's tenants by line (name and scope), so
	// a call allocates none.
	files sync.Map
	// seen is when each tenant last called (name -> *atomic.Int64, Unix
	// seconds): its status's lastSeen.
	seen sync.Map
}

// snapshot is the Tenant objects as last read, replaced whole.
type snapshot struct {
	creds   []credential
	tenants []Declared
}

// credential is one token a Tenant's Secret held when last read.
type credential struct {
	token  []byte
	tenant *Tenant
}

// Declared is a Tenant object as the registry last read it: the tenant,
// which of its credentials could not be read (and are refused), and
// which are kept as last read while their Secret cannot be.
type Declared struct {
	Object     *v1.Tenant
	Tenant     *Tenant
	Missing    []string
	Unreadable []string
	// tokens are the credentials' tokens in spec order (nil: unread).
	tokens [][]byte
}

// Enabled implements auth.Verifier: calls need a token once the file or
// a Tenant holds one.
func (r *Registry) Enabled() bool {
	return r != nil && (r.watching.Load() || r.File.Enabled())
}

// Lookup is the tenant holding token, every credential compared in
// constant time.
func (r *Registry) Lookup(token string) (*Tenant, bool) {
	var found *Tenant
	if s := r.snap.Load(); s != nil {
		tok := []byte(token)
		for _, c := range s.creds {
			if subtle.ConstantTimeCompare(tok, c.token) == 1 {
				found = c.tenant
			}
		}
	}
	h, inFile := r.File.Lookup(token)
	switch {
	case found != nil:
		return found, true
	case !inFile:
		return nil, false
	}
	if t, ok := r.files.Load(h); ok {
		return t.(*Tenant), true
	}
	t, _ := r.files.LoadOrStore(h, fromFile(h))
	return t.(*Tenant), true
}

// Verify implements auth.Verifier for the gRPC and REST transport: the
// caller holding token, in ctx (CallerOf), if it may call method.
func (r *Registry) Verify(ctx context.Context, method, token string) (context.Context, error) {
	v, ok := verbOf[method]
	unverbed := ""
	if !ok && strings.HasPrefix(method, leaseService) {
		unverbed = method
	}
	c, err := r.authorize(token, v, unverbed)
	if err != nil {
		return ctx, err
	}
	return with(ctx, c), nil
}

// Gateway is the proxy gateway's caller for a proxy password: its
// tenant, if it may use the gateway.
func (r *Registry) Gateway(password string) (Caller, error) {
	c, err := r.authorize(password, Gateway, "")
	c.Gateway = true
	return c, err
}

// Recheck asks again about the credential c came with, for a long-lived
// use of it (a watch, a tunnel's renewals) that must end once the
// credential is removed or its tenant may no longer use verb (the
// gateway, for a gateway caller): c as its tenant is declared now.
func (r *Registry) Recheck(c Caller, v Verb) (Caller, error) {
	if !r.Enabled() {
		return c, nil
	}
	if c.Gateway {
		v = Gateway
	}
	n, err := r.authorize(c.token, v, "")
	n.Gateway = c.Gateway
	return n, err
}

// authorize finds the tenant holding token and checks it may use v; a
// LeaseService method named as unverbed has no verb and is refused to
// all; with neither (gRPC health, reflection) any holder may call.
func (r *Registry) authorize(token string, v Verb, unverbed string) (Caller, error) {
	t, ok := r.Lookup(token)
	if !ok {
		return Caller{}, auth.ErrInvalidToken
	}
	r.touch(t.Name)
	var err error
	switch {
	case v != "":
		err = t.Allow(v)
	case unverbed != "":
		err = t.Denied("TENANT_VERB", "method %s has no verb: no tenant may call it", unverbed)
	}
	if err != nil {
		// Counted here: the call never reaches what counts the others.
		Refusals.WithLabelValues(Label(t.Name), "TENANT_VERB").Inc()
		return Caller{}, err
	}
	return Caller{Tenant: t, token: token}, nil
}

func (r *Registry) touch(name string) {
	now := time.Now().Unix()
	v, ok := r.seen.Load(name)
	if !ok {
		v, _ = r.seen.LoadOrStore(name, new(atomic.Int64))
	}
	if s := v.(*atomic.Int64); s.Load() != now {
		s.Store(now)
	}
}

// Seen is when each tenant that called this broker since it started
// last did.
func (r *Registry) Seen() map[string]time.Time {
	out := map[string]time.Time{}
	r.seen.Range(func(k, v any) bool {
		out[k.(string)] = time.Unix(v.(*atomic.Int64).Load(), 0)
		return true
	})
	return out
}

// LastSeen is when the tenant named name last called this broker (zero:
// not since it started).
func (r *Registry) LastSeen(name string) time.Time {
	if v, ok := r.seen.Load(name); ok {
		return time.Unix(v.(*atomic.Int64).Load(), 0)
	}
	return time.Time{}
}

// Declared are the Tenant objects as last read (nil before Watch).
func (r *Registry) Declared() []Declared {
	if s := r.snap.Load(); s != nil {
		return s.tenants
	}
	return nil
}

// Watch keeps the registry current from the Tenants in c (a cache of the
// brokers' namespace) and their credentials Secrets, read with secrets
// (a client that reads each by name: the brokers may get only those), on
// every Tenant change and every reread, until ctx ends. It returns once
// the first read is done.
func (r *Registry) Watch(ctx context.Context, c crcache.Cache, secrets client.Reader, reread time.Duration) error {
	r.watching.Store(true)
	inf, err := c.GetInformer(ctx, &v1.Tenant{})
	if err != nil {
		return fmt.Errorf("getting the Tenant informer: %w", err)
	}
	changed := make(chan struct{}, 1)
	poke := func() {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() }, DeleteFunc: func(any) { poke() },
		// A status write (every broker's, every 30 s) changes no
		// generation: it is read at the next reread.
		UpdateFunc: func(a, b any) {
			if ao, ok := a.(*v1.Tenant); !ok || ao.Generation != b.(*v1.Tenant).Generation {
				poke()
			}
		},
	}); err != nil {
		return err
	}
	syncCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !c.WaitForCacheSync(syncCtx) {
		return fmt.Errorf("the Tenants did not sync within a minute (is the Tenant CRD installed, and may the broker list Tenants?): %w", syncCtx.Err())
	}
	read := func() {
		if err := r.read(ctx, c, secrets); err != nil {
			r.Log.Warn("reading the Tenants", "err", err)
		}
	}
	read()
	go func() {
		t := time.NewTicker(reread)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changed:
			case <-t.C:
			}
			read()
		}
	}()
	return nil
}

// DefaultGrace is Registry.Grace's default: a minute of an API server
// outage or a botched RBAC change does not lock every crawler out, and
// a credential whose read the brokers lost stops working soon after.
const DefaultGrace = time.Minute

// read builds a new snapshot. A Secret that cannot be read for a reason
// that may pass (the API server unreachable, a get no longer granted)
// keeps the token last read from it for Grace, then fails closed; one
// that is gone, or lacks its key, is dropped: a removed credential stops
// working within one reread.
func (r *Registry) read(ctx context.Context, c crcache.Cache, secrets client.Reader) error {
	var list v1.TenantList
	if err := c.List(ctx, &list); err != nil {
		return err
	}
	prev := map[string][]byte{}
	if s := r.snap.Load(); s != nil {
		for _, d := range s.tenants {
			for i, cr := range d.Object.Spec.Credentials {
				if tok := d.tokens[i]; tok != nil {
					prev[credentialKey(d.Object, cr)] = tok
				}
			}
		}
	}
	grace, now := r.Grace, r.clock().Now()
	if grace <= 0 {
		grace = DefaultGrace
	}
	failing := map[string]time.Time{}
	fileNames := r.File.Names()
	next := &snapshot{}
	for i := range list.Items {
		o := list.Items[i].DeepCopy()
		d := Declared{Object: o, Tenant: FromObject(o)}
		d.tokens = make([][]byte, len(o.Spec.Credentials))
		if slices.Contains(fileNames, o.Name) {
			// One name space keys leases, sessions, request ids and quotas:
			// a Tenant named as a token-file line would be that holder.
			r.Log.Error("a Tenant is named as a token-file line: its credentials are refused until it is renamed", "tenant", o.Namespace+"/"+o.Name)
			for _, cr := range o.Spec.Credentials {
				d.Missing = append(d.Missing, fmt.Sprintf("%s: the Tenant's name %q is the name of a line of the brokers' token file (an unnamed line's is token-<line>), and names key leases, sessions and quotas; rename the Tenant", credentialKey(o, cr), o.Name))
			}
			next.tenants = append(next.tenants, d)
			continue
		}
		for k, cr := range o.Spec.Credentials {
			key := credentialKey(o, cr)
			tok, err := readCredential(ctx, secrets, o, cr)
			if err != nil && !apierrors.IsNotFound(err) && !isMissingKey(err) && prev[key] != nil {
				since, ok := r.unreadable[key]
				if !ok {
					since = now
				}
				failing[key] = since
				if left := grace - now.Sub(since); left > 0 {
					r.Log.Warn("keeping a tenant's credential as last read", "tenant", o.Name, "secret", key, "err", err, "refusedIn", left)
					d.Unreadable = append(d.Unreadable, fmt.Sprintf("%s: %v (kept as last read; refused in %s unless it is read)", key, err, left.Round(time.Second)))
					tok, err = prev[key], nil
				} else {
					err = fmt.Errorf("unreadable for %s, longer than the brokers' grace of %s: %w", now.Sub(since).Round(time.Second), grace, err)
				}
			}
			if err != nil {
				d.Missing = append(d.Missing, fmt.Sprintf("%s: %v", key, err))
				continue
			}
			d.tokens[k] = tok
			next.creds = append(next.creds, credential{token: tok, tenant: d.Tenant})
		}
		next.tenants = append(next.tenants, d)
	}
	r.unreadable = failing
	r.snap.Store(next)
	return nil
}

func (r *Registry) clock() clock.PassiveClock {
	if r.Clock == nil {
		return clock.RealClock{}
	}
	return r.Clock
}

func credentialKey(o *v1.Tenant, c v1.TenantCredential) string {
	return secretOf(o, c).String() + "[" + keyOf(c) + "]"
}

// secretOf names the Secret holding c: in its own namespace, else the
// Tenant's.
func secretOf(o *v1.Tenant, c v1.TenantCredential) types.NamespacedName {
	if c.Namespace != "" {
		return types.NamespacedName{Namespace: c.Namespace, Name: c.Name}
	}
	return types.NamespacedName{Namespace: o.Namespace, Name: c.Name}
}

func keyOf(c v1.TenantCredential) string {
	if c.Key == "" {
		return "token"
	}
	return c.Key
}

type missingKeyError struct{ key string }

func (e *missingKeyError) Error() string {
	return fmt.Sprintf("the Secret has no key %q, or it is empty", e.key)
}

func isMissingKey(err error) bool {
	_, ok := err.(*missingKeyError)
	return ok
}

// readCredential reads one credential, its token trimmed as a token
// file's lines are.
func readCredential(ctx context.Context, secrets client.Reader, o *v1.Tenant, c v1.TenantCredential) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var s corev1.Secret
	if err := secrets.Get(ctx, secretOf(o, c), &s); err != nil {
		return nil, err
	}
	tok := []byte(strings.TrimSpace(string(s.Data[keyOf(c)])))
	if len(tok) == 0 {
		return nil, &missingKeyError{keyOf(c)}
	}
	return tok, nil
}
