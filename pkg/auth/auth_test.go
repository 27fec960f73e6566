package auth

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestCheck(t *testing.T) {
	tok := Static("s3cret")
	cases := map[string]struct {
		header string
		code   codes.Code
	}{
		"right":        {"Bearer s3cret", codes.OK},
		"wrong":        {"Bearer nope", codes.Unauthenticated},
		"missing":      {"", codes.Unauthenticated},
		"other scheme": {"Basic czNjcmV0", codes.Unauthenticated},
		"prefix only":  {"Bearer s3cre", codes.Unauthenticated},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := verifyHeader(context.Background(), tok, tc.header)
			assert.Equal(t, tc.code, status.Code(err))
		})
	}
	var none *Token
	_, err := verifyHeader(context.Background(), none, "")
	assert.NoError(t, err, "no token configured: everything passes")
}

// Lines name their tokens; the name, never the token, says who called.
func TestTokensAreNamed(t *testing.T) {
	tok := Static("team-a:s3cret", "bare-token", "Bad Name:x:y", "controller:with:colons")
	for header, want := range map[string]string{
		"Bearer s3cret":          "team-a",
		"Bearer bare-token":      "token-2",
		"Bearer Bad Name:x:y":    "token-3", // not a name: the whole line is the token
		"Bearer with:colons":     "controller",
		"Bearer team-a:s3cret":   "",
		"Bearer controller:with": "",
	} {
		ctx, err := verifyHeader(context.Background(), tok, header)
		if want == "" {
			assert.Error(t, err, header)
			continue
		}
		require.NoError(t, err, header)
		assert.Equal(t, want, Caller(ctx), header)
	}
	assert.Equal(t, "s3cret", tok.Value(), "a client sends the first token, not its name")
	assert.Empty(t, Caller(context.Background()))
}

// A file with a line that holds no token, or a token shorter than
// MinTokenLength, is refused at load, naming the line and never the token.
func TestEmptyAndShortTokensAreRefused(t *testing.T) {
	cases := []struct{ file, want string }{
		{"team:\n", `line 1 names "team" but holds no token after the colon`},
		{"good:long-enough-token\nteam:short\n", "line 2 (team): its token is 5 bytes, under the least of 8"},
		{"tiny\n", "line 1 (token-1): its token is 4 bytes"},
		{"gw:1234567 scope=gateway\n", "line 1 (gw): its token is 7 bytes"},
	}
	for _, c := range cases {
		path := filepath.Join(t.TempDir(), "token")
		require.NoError(t, os.WriteFile(path, []byte(c.file), 0o600))
		_, err := FromFile(t.Context(), slog.Default(), path, time.Second)
		require.ErrorContains(t, err, c.want, c.file)
		assert.NotContains(t, err.Error(), "short", "the token itself is never in the error")
	}
	path := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(path, []byte("a:12345678\nb:abcdefgh scope=gateway\na:87654321\n"), 0o600))
	tok, err := FromFile(t.Context(), slog.Default(), path, time.Second)
	require.NoError(t, err, "eight bytes is enough")
	assert.Equal(t, []string{"a", "b"}, tok.Names())
}

func TestFileIsReloadedWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	require.NoError(t, os.WriteFile(path, []byte("token-one\n"), 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tok, err := FromFile(ctx, slog.Default(), path, 10*time.Millisecond)
	require.NoError(t, err)
	require.NoError(t, check(tok, "Bearer token-one"), "trailing newline trimmed")

	require.NoError(t, os.WriteFile(path, []byte("token-two"), 0o600))
	require.Eventually(t, func() bool { return check(tok, "Bearer token-two") == nil }, 5*time.Second, 10*time.Millisecond)
	assert.Error(t, check(tok, "Bearer token-one"), "the old token stops working")

	require.NoError(t, os.WriteFile(path, nil, 0o600))
	time.Sleep(50 * time.Millisecond)
	assert.NoError(t, check(tok, "Bearer token-two"), "an emptied file keeps the previous token")

	require.NoError(t, os.WriteFile(path, []byte("team:\n"), 0o600))
	time.Sleep(50 * time.Millisecond)
	assert.NoError(t, check(tok, "Bearer token-two"), "a file with a bad line keeps the previous tokens")
	assert.Error(t, check(tok, "Bearer team:"))

	_, err = FromFile(ctx, slog.Default(), filepath.Join(t.TempDir(), "absent"), time.Second)
	assert.ErrorContains(t, err, "absent")
}

// A rotation in three steps, each read by server and client at their own
// time: at no step is the client's token refused.
func TestRotationHasNoGap(t *testing.T) {
	dir := t.TempDir()
	serverFile, clientFile := filepath.Join(dir, "server"), filepath.Join(dir, "client")
	write := func(path, content string) { require.NoError(t, os.WriteFile(path, []byte(content), 0o600)) }
	write(serverFile, "old-token\n")
	write(clientFile, "old-token\n")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server, err := FromFile(ctx, slog.Default(), serverFile, 5*time.Millisecond)
	require.NoError(t, err)
	client, err := FromFile(ctx, slog.Default(), clientFile, 5*time.Millisecond)
	require.NoError(t, err)
	accepted := func() bool { return check(server, "Bearer "+client.Value()) == nil }
	require.True(t, accepted())

	// Each step reaches the client first, then the server, or the other
	// way round; both orders must hold.
	for _, order := range [][2]string{{clientFile, serverFile}, {serverFile, clientFile}} {
		write(serverFile, "old-token\n")
		write(clientFile, "old-token\n")
		for _, step := range []string{"old-token\nnew-token\n", "new-token\nold-token\n", "new-token\n"} {
			for _, f := range order {
				write(f, step)
				time.Sleep(30 * time.Millisecond)
				assert.True(t, accepted(), "step %q with %s updated first", step, filepath.Base(order[0]))
			}
		}
	}
	require.Eventually(t, func() bool { return client.Value() == "new-token" && check(server, "Bearer old-token") != nil }, 5*time.Second, 5*time.Millisecond,
		"at the end the client sends the new token and the old one is gone")
}

func check(t *Token, header string) error {
	_, err := verifyHeader(context.Background(), t, header)
	return err
}

// verifyHeader is a call arriving with an Authorization header.
func verifyHeader(ctx context.Context, v Verifier, header string) (context.Context, error) {
	return verify(metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", header)), v, "/svc/Method")
}

// A token line ending in scope=gateway is refused by the lease API, by
// name, and looked up as gateway-only (the broker's gateway takes it);
// the rest of the line is the token, and other tokens are unaffected.
func TestGatewayScopedTokens(t *testing.T) {
	tok := Static("crawl-gw:gw-secret scope=gateway", "team:api-secret", "odd:has space")
	for _, tc := range []struct {
		name, token string
		caller      string
		code        codes.Code
		gatewayOnly bool
	}{
		{"gateway token at the API", "gw-secret", "", codes.PermissionDenied, true},
		{"the scope is not part of the token", "gw-secret scope=gateway", "", codes.Unauthenticated, false},
		{"API token at the API", "api-secret", "team", codes.OK, false},
		{"another option is part of the token", "has space", "odd", codes.OK, false},
	} {
		ctx, err := verifyHeader(context.Background(), tok, "Bearer "+tc.token)
		assert.Equal(t, tc.code, status.Code(err), "%s: %v", tc.name, err)
		assert.Equal(t, tc.caller, Caller(ctx), tc.name)
		if tc.code == codes.PermissionDenied {
			assert.Contains(t, status.Convert(err).Message(), `token "crawl-gw" is limited to the proxy gateway`)
		}
		h, found := tok.Lookup(tc.token)
		assert.Equal(t, tc.code != codes.Unauthenticated, found, tc.name)
		assert.Equal(t, tc.gatewayOnly, h.GatewayOnly, tc.name)
	}
}

// The gateway token file's tokens are limited to the gateway whatever
// their lines say, its unnamed lines are gateway-<n>, and merged with the
// token file they are served as one: each token as its own file says.
func TestAGatewayTokenFileMergesWithTheTokenFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokens"), []byte("discovery-secret-1\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "gateway"), []byte("crawler-proxy-password\n"), 0o600))
	main, err := FromFile(t.Context(), slog.Default(), filepath.Join(dir, "tokens"), time.Second)
	require.NoError(t, err)
	gw, err := FromGatewayFile(t.Context(), slog.Default(), filepath.Join(dir, "gateway"), time.Second)
	require.NoError(t, err)
	tok := Merge(main, nil, gw)
	assert.True(t, tok.Enabled())
	assert.Equal(t, "discovery-secret-1", tok.Value(), "a client sends the first set's token")
	assert.Equal(t, []string{"token-1", "gateway-1"}, tok.Names())

	ctx, err := verifyHeader(t.Context(), tok, "Bearer discovery-secret-1")
	require.NoError(t, err)
	assert.Equal(t, "token-1", Caller(ctx))
	_, err = verifyHeader(t.Context(), tok, "Bearer crawler-proxy-password")
	assert.Equal(t, codes.PermissionDenied, status.Code(err), "the gateway token cannot call the lease API: %v", err)
	h, found := tok.Lookup("crawler-proxy-password")
	assert.True(t, found, "the gateway finds it")
	assert.Equal(t, Holder{Name: "gateway-1", GatewayOnly: true}, h)
	assert.Nil(t, Merge(nil, nil))
}
