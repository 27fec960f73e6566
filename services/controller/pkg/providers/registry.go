package providers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
)

// Deps is what a factory may use to build its provider.
type Deps struct {
	// Client writes through the manager's cache-backed client.
	Client client.Client
	// APIReader reads the API server directly, never a cache: a provider
	// whose instances are Kubernetes objects must not report NotFound from
	// a lagging cache.
	APIReader client.Reader
	// Namespace the controller runs in.
	Namespace string
	// Egress is where a proxy may take its clients, for providers that
	// write their instances' proxy config.
	Egress netpolicy.Egress
	Log    *slog.Logger
}

// Factory builds the provider of one entry. It returns an UnavailableError
// when the entry is well-formed but cannot work here (credentials not
// mounted): the manager then starts, warns, and fails only that entry's
// Proxies. Any other error is a config error and stops start-up.
type Factory func(ctx context.Context, e Entry, deps Deps) (Provider, error)

// UnavailableError says why an entry cannot be used.
type UnavailableError struct {
	Entry string
	Err   error
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("provider %q is unavailable: %v", e.Entry, e.Err)
}
func (e *UnavailableError) Unwrap() error { return e.Err }

// IsUnavailable reports whether err is or wraps an UnavailableError.
func IsUnavailable(err error) bool { var e *UnavailableError; return errors.As(err, &e) }

// UnknownProviderError: a Proxy names an entry the config does not have.
type UnknownProviderError struct {
	Name  string
	Known []string
}

func (e *UnknownProviderError) Error() string {
	return fmt.Sprintf("spec.provider %q names no entry of the providers config (entries: %s)", e.Name, strings.Join(e.Known, ", "))
}

// IsUnknownProvider reports whether err is or wraps an UnknownProviderError.
func IsUnknownProvider(err error) bool { var e *UnknownProviderError; return errors.As(err, &e) }

// Registry holds the provider of every configured entry, or why it is
// unavailable.
type Registry struct {
	entries map[string]registered
}

type registered struct {
	entry    Entry
	provider Provider
	err      error
}

// NewRegistry builds a provider for every entry with the factory of its
// type, each wrapped in the metrics and tracing decorator.
func NewRegistry(ctx context.Context, entries []Entry, factories map[string]Factory, deps Deps) (*Registry, error) {
	r := &Registry{entries: map[string]registered{}}
	for _, e := range entries {
		f, ok := factories[e.Type]
		if !ok {
			return nil, fmt.Errorf("provider %s: no factory for type %q", e.Name, e.Type)
		}
		p, err := f(ctx, e, deps)
		switch {
		case err == nil:
			r.entries[e.Name] = registered{entry: e, provider: Instrument(p, e.Name, e.Type)}
		case IsUnavailable(err):
			deps.Log.Warn("provider entry unavailable: Proxies on it will fail until it is fixed", "provider", e.Name, "type", e.Type, "err", err)
			r.entries[e.Name] = registered{entry: e, err: err}
		default:
			return nil, err
		}
	}
	return r, nil
}

// Get returns the provider named by a Proxy's spec.provider, or an
// UnknownProviderError or UnavailableError.
func (r *Registry) Get(name string) (Provider, error) {
	reg, ok := r.entries[name]
	if !ok {
		return nil, &UnknownProviderError{Name: name, Known: r.Names()}
	}
	return reg.provider, reg.err
}

// Names lists every entry, sorted.
func (r *Registry) Names() []string {
	names := make([]string, 0, len(r.entries))
	for n := range r.entries {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Available returns the usable providers by entry name.
func (r *Registry) Available() map[string]Provider {
	out := map[string]Provider{}
	for n, reg := range r.entries {
		if reg.err == nil {
			out[n] = reg.provider
		}
	}
	return out
}
