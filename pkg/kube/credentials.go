package kube

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
)

// CredentialSecrets narrows a cache's Secrets to those labelled
// crawl.example.com/proxy-credentials=true, the ones Proxies name for
// their credentials: both the controller's probe hub and the broker
// watch Secrets cluster-wide, which RBAC cannot narrow.
func CredentialSecrets() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{v1.LabelProxyCredentials: "true"})},
	}
}

// CredentialsRef is what decides the credentials a proxy asks for, small
// enough for the broker to keep per proxy instead of the object.
type CredentialsRef struct {
	Namespace, UID string
	Managed        bool
	// Secret names an External proxy's credentialsSecretRef, in Namespace.
	Secret string
}

// CredentialsRefOf is px's CredentialsRef.
func CredentialsRefOf(px *v1.Proxy) CredentialsRef {
	r := CredentialsRef{Namespace: px.Namespace, UID: string(px.UID), Managed: px.Spec.Mode == v1.ModeManaged}
	if ref := px.Spec.CredentialsSecretRef; ref != nil {
		r.Secret = ref.Name
	}
	return r
}

// ProxyCredentials gives a proxy the credentials it asks for, the one way
// the controller's probes and the brokers' leases both do: a Managed
// proxy's derived from Key and its UID (as its instance was made with),
// an External proxy's from the Secret it names, none otherwise.
type ProxyCredentials struct {
	Key proxyauth.Key
	// Secrets reads the Secrets CredentialSecrets selects.
	Secrets client.Reader
}

// Of are r's credentials; the error names the Secret and what is wrong.
func (c ProxyCredentials) Of(ctx context.Context, r CredentialsRef) (proxyauth.Credentials, error) {
	switch {
	case r.Managed:
		return c.Key.Derive(r.UID), nil
	case r.Secret == "":
		return proxyauth.Credentials{}, nil
	case c.Secrets == nil:
		return proxyauth.Credentials{}, errors.New("no credentials Secret cache")
	}
	var s corev1.Secret
	if err := c.Secrets.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Secret}, &s); err != nil {
		return proxyauth.Credentials{}, fmt.Errorf("reading Secret %s/%s (it must be labelled %s=true): %w", r.Namespace, r.Secret, v1.LabelProxyCredentials, err)
	}
	return proxyauth.FromSecret(&s)
}
