package access

import "context"

// Caller is who makes a call and through which door. The transport that
// takes the call builds it once: the gRPC and REST interceptor from the
// bearer token (Registry.Verify), the proxy gateway from the proxy
// password (Registry.Gateway). The lease service takes it as an argument
// and checks nothing about the credential again; verbs are the
// transport's to check, scope and quotas the service's, from Tenant.
type Caller struct {
	*Tenant
	// Gateway: the proxy gateway calls on the tenant's behalf. Its
	// reports are what the gateway saw a site answer, as many as the
	// tenant's tunnels (which its quotas bound), so they are not drawn
	// from the tenant's report budget, which bounds what a caller claims.
	Gateway bool
	// token is the credential the caller came with: a long-lived use (a
	// watch, a tunnel's renewals) asks the registry about it again
	// (Registry.Recheck). Empty when the broker authenticates no one.
	token string
}

// String names the caller and never its token.
func (c Caller) String() string {
	if c.Gateway {
		return c.Name + " (gateway)"
	}
	return c.Name
}

// Anonymous is the caller of every call when the broker has no
// credentials configured.
var Anonymous = Caller{Tenant: Open}

type callerKey struct{}

// with is ctx for a call by c: how the gRPC transport hands the caller
// its interceptor built to the handler.
func with(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf is the caller the gRPC interceptor put in ctx: Anonymous when
// the broker authenticates no one.
func CallerOf(ctx context.Context) Caller {
	if c, ok := ctx.Value(callerKey{}).(Caller); ok {
		return c
	}
	return Anonymous
}
