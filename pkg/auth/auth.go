// Package auth is the shared bearer-token authentication of the project's
// gRPC servers (the broker's lease API, the controller's probe endpoint):
// tokens read from a file (a mounted Secret), re-read when the file
// changes, compared in constant time.
//
// The file holds one token per line, each named: "name:token". The name
// says who calls (a crawler team, the controller) in logs and metrics and
// keys per-caller limits, and never the token itself does; a line with no
// name is named "token-<line number>". A line may end in " scope=gateway":
// that token is for the broker's proxy gateway (Holder.GatewayOnly; the
// broker lets it report on its own tunnels too, and nothing else), so a
// gateway password sniffed or leaked from a crawler's proxy URL cannot
// lease over the API, whose leases carry every proxy's credentials. A client sends the first token; a
// server accepts any. That makes rotation gapless: add the new token as a
// second line (under the same name), then (once every replica has re-read
// the file) move it first, then drop the old one. At every step each
// sender's token is accepted.
package auth

import (
	"bytes"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/filewatch"
)

// Token holds the current tokens. The zero value (and a nil *Token)
// allows every call: no token configured.
type Token struct {
	// sets are the token lists in use, each a file's (as last read) or
	// fixed ones: the first set's first token is sent, any is accepted.
	sets []func() []named
}

// named is one line of a token file.
type named struct {
	name string
	tok  []byte
	// gatewayOnly: scope=gateway.
	gatewayOnly bool
}

// scopeGateway is the line option that limits a token to the gateway.
const scopeGateway = "scope=gateway"

// FromFile reads the tokens at path and re-reads them every interval until
// ctx ends, so a rotated Secret takes effect without a restart. The file
// must hold at least one token.
func FromFile(ctx context.Context, log *slog.Logger, path string, interval time.Duration) (*Token, error) {
	return follow(ctx, log, interval, "token file", path, parse)
}

// FromGatewayFile is FromFile for a file every token of which is limited
// to the gateway, as if each line ended in scope=gateway; its unnamed
// lines are named "gateway-<line>". It is the chart's default gateway
// password: one crawlers may put in their proxy URLs.
func FromGatewayFile(ctx context.Context, log *slog.Logger, path string, interval time.Duration) (*Token, error) {
	return follow(ctx, log, interval, "gateway token file", path, func(b []byte) ([]named, error) {
		toks, err := parseNamed(b, "gateway")
		for i := range toks {
			toks[i].gatewayOnly = true
		}
		return toks, err
	})
}

// follow is a Token of the file at path, parsed by parse and re-read.
func follow(ctx context.Context, log *slog.Logger, interval time.Duration, what, path string, parse func([]byte) ([]named, error)) (*Token, error) {
	f, err := filewatch.FollowFile(ctx, log, interval, what, path, parse)
	if err != nil {
		return nil, err
	}
	return &Token{sets: []func() []named{f.Value}}, nil
}

// Merge serves tokens as one: a token of any is accepted as its line
// says, and a client sends the first one's first token. Nil ones are
// skipped; none left is nil (no token configured).
func Merge(tokens ...*Token) *Token {
	var sets []func() []named
	for _, t := range tokens {
		if t != nil {
			sets = append(sets, t.sets...)
		}
	}
	if len(sets) == 0 {
		return nil
	}
	return &Token{sets: sets}
}

// Static returns fixed tokens, lines as in a file: the first sent, any
// accepted (tests).
func Static(lines ...string) *Token {
	// A client sends what it was given; the server it calls judges it.
	toks, _ := parse([]byte(strings.Join(lines, "\n")))
	return &Token{sets: []func() []named{func() []named { return toks }}}
}

// tokenName is what a line's name may be: it goes into logs and metric
// labels.
var tokenName = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$`)

// MinTokenLength is the shortest token a file may hold: a floor against
// a slip (a name with its token left out, a placeholder), not a strength
// rating. The chart's generated tokens are 32 random characters.
const MinTokenLength = 8

// parse splits a file's content into its tokens, one per non-empty line,
// "name:token" or a bare token. The error names each line that holds no
// token or one under MinTokenLength, never the token: a file with one is
// refused whole, so a typo cannot open the API to a guessable token.
func parse(b []byte) ([]named, error) { return parseNamed(b, "token") }

// parseNamed is parse, naming an unnamed line "<unnamed>-<line>".
func parseNamed(b []byte, unnamed string) ([]named, error) {
	var toks []named
	var errs []error
	for i, line := range bytes.Split(b, []byte("\n")) {
		if line = bytes.TrimSpace(line); len(line) == 0 {
			continue
		}
		gatewayOnly := false
		if head, opt, ok := bytes.Cut(line, []byte(" ")); ok && string(bytes.TrimSpace(opt)) == scopeGateway {
			line, gatewayOnly = head, true
		}
		n := named{name: fmt.Sprintf("%s-%d", unnamed, i+1), tok: line, gatewayOnly: gatewayOnly}
		if name, tok, ok := bytes.Cut(line, []byte(":")); ok && tokenName.Match(name) {
			n = named{name: string(name), tok: tok, gatewayOnly: gatewayOnly}
		}
		switch {
		case len(n.tok) == 0:
			errs = append(errs, fmt.Errorf("line %d names %q but holds no token after the colon", i+1, n.name))
		case len(n.tok) < MinTokenLength:
			errs = append(errs, fmt.Errorf("line %d (%s): its token is %d bytes, under the least of %d (generate one with: openssl rand -hex 32)", i+1, n.name, len(n.tok), MinTokenLength))
		}
		toks = append(toks, n)
	}
	return toks, errors.Join(errs...)
}

// Names are the holders the tokens name, in order, once each.
func (t *Token) Names() []string {
	var out []string
	for _, set := range t.lists() {
		for _, n := range set() {
			if !slices.Contains(out, n.name) {
				out = append(out, n.name)
			}
		}
	}
	return out
}

// lists are t's sets; none for a nil t.
func (t *Token) lists() []func() []named {
	if t == nil {
		return nil
	}
	return t.sets
}

// Enabled reports whether a token is configured.
func (t *Token) Enabled() bool { return t.Value() != "" }

// Value returns the token a client sends: the first.
func (t *Token) Value() string {
	for _, set := range t.lists() {
		if toks := set(); len(toks) > 0 {
			return string(toks[0].tok)
		}
	}
	return ""
}

// Holder is who holds a token: its line's name, and whether the line
// limits it to the gateway.
type Holder struct {
	Name        string
	GatewayOnly bool
}

// Lookup finds the holder of token, comparing it with every token in
// constant time, so the time taken does not say which matched.
func (t *Token) Lookup(token string) (Holder, bool) {
	var h Holder
	found := false
	tok := []byte(token)
	for _, set := range t.lists() {
		for _, w := range set() {
			if subtle.ConstantTimeCompare(tok, w.tok) == 1 {
				h, found = Holder{Name: w.name, GatewayOnly: w.gatewayOnly}, true
			}
		}
	}
	return h, found
}

// Verify implements Verifier: a call of any method with any token in the
// file, but one limited to the gateway (the broker's proxy gateway
// authenticates its passwords itself, and never through a Verifier).
func (t *Token) Verify(ctx context.Context, _, token string) (context.Context, error) {
	h, ok := t.Lookup(token)
	if !ok {
		return ctx, ErrInvalidToken
	}
	if h.GatewayOnly {
		return ctx, status.Errorf(codes.PermissionDenied, "token %q is limited to the proxy gateway (%s in the token file): it cannot call the lease API", h.Name, scopeGateway)
	}
	return WithCaller(ctx, h.Name), nil
}

// ErrInvalidToken answers a token no one holds.
var ErrInvalidToken = status.Error(codes.Unauthenticated, "invalid bearer token")

// A Verifier says who holds a bearer token, and whether they may call a
// method with it.
type Verifier interface {
	// Enabled reports whether calls must carry a token; when false every
	// call passes unauthenticated.
	Enabled() bool
	// Verify returns ctx for a call of method (a gRPC full method name)
	// made with token, its holder named in it (Caller), or an
	// Unauthenticated or PermissionDenied status error that says why.
	Verify(ctx context.Context, method, token string) (context.Context, error)
}

// BearerToken is the token of an Authorization value "Bearer <token>".
func BearerToken(authorization string) (string, error) {
	got, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || got == "" {
		return "", status.Error(codes.Unauthenticated, "missing bearer token: send the header \"Authorization: Bearer <token>\"")
	}
	return got, nil
}

func verify(ctx context.Context, v Verifier, method string) (context.Context, error) {
	if v == nil || !v.Enabled() {
		return ctx, nil
	}
	// One key, not the whole map: FromIncomingContext copies every key.
	var authorization string
	if a := metadata.ValueFromIncomingContext(ctx, "authorization"); len(a) > 0 {
		authorization = a[0]
	}
	tok, err := BearerToken(authorization)
	if err != nil {
		return ctx, err
	}
	return v.Verify(ctx, method, tok)
}

type callerKey struct{}

// WithCaller is ctx for a call authenticated as the token named name.
func WithCaller(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, callerKey{}, name)
}

// Caller is the name of the token a call was authenticated with, "" when
// the server has none configured.
func Caller(ctx context.Context) string {
	name, _ := ctx.Value(callerKey{}).(string)
	return name
}

// UnaryInterceptor rejects the unary calls v refuses and names the
// caller in the context of the others.
func UnaryInterceptor(v Verifier) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, err := verify(ctx, v, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamInterceptor rejects the streams v refuses and names the caller in
// the context of the others.
func StreamInterceptor(v Verifier) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		ctx, err := verify(ss.Context(), v, info.FullMethod)
		if err != nil {
			return err
		}
		return h(srv, &callerStream{ServerStream: ss, ctx: ctx})
	}
}

type callerStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *callerStream) Context() context.Context { return s.ctx }

// PerRPC returns client credentials sending the token on every call.
func (t *Token) PerRPC() grpc.CallOption { return grpc.PerRPCCredentials(bearer{t}) }

type bearer struct{ t *Token }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if !b.t.Enabled() {
		return nil, nil
	}
	return map[string]string{"authorization": "Bearer " + b.t.Value()}, nil
}

// RequireTransportSecurity is false: the token guards loopback and
// in-cluster plain-text connections too; TLS is the deployment's choice.
func (bearer) RequireTransportSecurity() bool { return false }

// DialOption sends the token on every call of a client connection.
func (t *Token) DialOption() grpc.DialOption { return grpc.WithPerRPCCredentials(bearer{t}) }

// FromFlag is FromFile for a --flag value: an empty path means no token
// (nil, which allows every call), and an error names the flag.
func FromFlag(ctx context.Context, log *slog.Logger, flag, path string) (*Token, error) {
	if path == "" {
		return nil, nil
	}
	t, err := FromFile(ctx, log, path, filewatch.Interval)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return t, nil
}
