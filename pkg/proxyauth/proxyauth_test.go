package proxyauth_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
	assert.Equal(t, "Basic Y3Jhd2xlcjpzM2NyOnQ=", proxyauth.Credentials{Username: "crawler", Password: "s3cr:t"}.Header())
	assert.True(t, proxyauth.Credentials{}.Empty())
}
