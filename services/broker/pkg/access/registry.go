package access

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

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
	// Clock times the grace and dates each tenant's last call; nil is
	// the wall clock.
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
	if err != nil {
		return Caller{}, err
	}
	c.Gateway = true
	return c, nil
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
	if err != nil {
		return Caller{}, err
	}
	n.Gateway = c.Gateway
	return n, nil
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
	now := r.clock().Now().Unix()
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

// Declared are the Tenant objects as last read (nil before Watch).
func (r *Registry) Declared() []Declared {
	if s := r.snap.Load(); s != nil {
		return s.tenants
	}
	return nil
}
