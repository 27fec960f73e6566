package access

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	crcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

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
