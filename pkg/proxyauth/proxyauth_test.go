package proxyauth_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
)

func TestFromSecret(t *testing.T) {
	for _, tc := range []struct {
		name string
		data map[string]string
		want proxyauth.Credentials
		err  string
	}{
		{"both", map[string]string{"username": "crawler", "password": "s3cr:t"}, proxyauth.Credentials{Username: "crawler", Password: "s3cr:t"}, ""},
		{"no password", map[string]string{"username": "crawler"}, proxyauth.Credentials{}, `Secret team/creds must hold non-empty "username" and "password" keys`},
		{"no keys", nil, proxyauth.Credentials{}, "must hold non-empty"},
		{"colon in user", map[string]string{"username": "a:b", "password": "p"}, proxyauth.Credentials{}, "may not hold a colon"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "creds"}, Data: map[string][]byte{}}
			for k, v := range tc.data {
				s.Data[k] = []byte(v)
			}
			got, err := proxyauth.FromSecret(s)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			assert.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
	h := http.Header{}
	proxyauth.Credentials{Username: "crawler", Password: "s3cr:t"}.Authorize(h)
	assert.Equal(t, "Basic Y3Jhd2xlcjpzM2NyOnQ=", h.Get("Proxy-Authorization"))
	assert.True(t, proxyauth.Credentials{}.Empty())
	none := http.Header{}
	proxyauth.Credentials{}.Authorize(none)
	assert.Empty(t, none, "no credentials, no header")
}

func TestDeriveIsPerProxyAndStable(t *testing.T) {
	k := proxyauth.Key(strings.Repeat("k", 32))
	a, b := k.Derive("uid-a"), k.Derive("uid-b")
	assert.Equal(t, a, k.Derive("uid-a"), "the controller and every broker agree")
	assert.NotEqual(t, a.Username, b.Username)
	assert.NotEqual(t, a.Password, b.Password)
	assert.Regexp(t, `^ep-[0-9a-f]{16}$`, a.Username)
	assert.Regexp(t, `^[0-9a-f]{32}$`, a.Password)
	assert.NotEqual(t, a, proxyauth.Key(strings.Repeat("j", 32)).Derive("uid-a"), "another key, other credentials")
	assert.True(t, proxyauth.Key(nil).Derive("uid-a").Empty(), "no key, no credentials")

	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	require.NoError(t, os.WriteFile(short, []byte("tiny\n"), 0o600))
	_, err := proxyauth.LoadKey(short)
	assert.ErrorContains(t, err, "holds 4 bytes; a proxy credentials key needs at least 32")
	good := filepath.Join(dir, "good")
	require.NoError(t, os.WriteFile(good, []byte(strings.Repeat("k", 32)+"\n"), 0o600))
	got, err := proxyauth.LoadKey(good)
	require.NoError(t, err)
	assert.Equal(t, k, got)
}

func TestExpandPlacesTheCredentials(t *testing.T) {
	c := proxyauth.Credentials{Username: "ep-0123", Password: "abcd"}
	in := []byte("user ${EGRESS_PROXY_USERNAME} pass ${EGRESS_PROXY_PASSWORD} shell ${HOME}\n")
	assert.Equal(t, "user ep-0123 pass abcd shell ${HOME}\n", string(c.Expand(in)), "only our placeholders")
	plain := []byte("#cloud-config\n")
	assert.Equal(t, plain, c.Expand(plain))
}

func TestSquidHelperQuotesWhatItCompares(t *testing.T) {
	h := proxyauth.Credentials{Username: "ep-0123", Password: "it's"}.SquidHelper()
	assert.Contains(t, h, `[ "$u" = 'ep-0123' ] && [ "$p" = 'it'\''s' ]`)
	k, err := proxyauth.LoadKey("")
	assert.NoError(t, err)
	assert.Nil(t, k, "no file, no key")
}
