package kube

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
)

// CredentialSecrets narrows a cache's Secrets to those labelled
// crawl.example.com/proxy-credentials=true, the ones Proxies name for
// their credentials, in namespaces (all when empty): both the
// controller's probe hub and the broker read them, and RBAC lets them
// read Secrets only in the namespaces the chart lists.
func CredentialSecrets(namespaces []string) map[client.Object]cache.ByObject {
	return SecretsLabelled(v1.LabelProxyCredentials, namespaces)
}

// SecretsLabelled is a cache's Secrets narrowed to those labelled
// label=true in namespaces (all when empty): least privilege in the cache
// as in RBAC, which grants Secrets only in those namespaces.
func SecretsLabelled(label string, namespaces []string) map[client.Object]cache.ByObject {
	by := cache.ByObject{Label: labels.SelectorFromSet(labels.Set{label: "true"})}
	if len(namespaces) > 0 {
		by.Namespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			by.Namespaces[ns] = cache.Config{}
		}
	}
	return map[client.Object]cache.ByObject{&corev1.Secret{}: by}
}

// ConfigMapsLabelled is SecretsLabelled for ConfigMaps.
func ConfigMapsLabelled(label string, namespaces []string) map[client.Object]cache.ByObject {
	by := SecretsLabelled(label, namespaces)
	out := map[client.Object]cache.ByObject{}
	for _, b := range by {
		out[&corev1.ConfigMap{}] = b
	}
	return out
}

// SecretNamespacesFlag is the help of the services' --secret-namespaces.
const SecretNamespacesFlag = "comma-separated namespaces whose Secrets (Proxies' credentials and cloud-init) are read, as the chart's RBAC allows: its release namespace and secretNamespaces; empty means every namespace (and needs a ClusterRole)"

// ErrSecretNamespace says a Secret sits where Secrets are not read.
type ErrSecretNamespace struct{ Namespace, Name string }

func (e *ErrSecretNamespace) Error() string {
	return fmt.Sprintf("Secret %s/%s: Secrets are not read in namespace %s; add it to the chart's secretNamespaces (--secret-namespaces), or keep the Secret in a namespace listed there", e.Namespace, e.Name, e.Namespace)
}

// CheckSecretNamespace is nil when a Secret in ns can be read with
// namespaces (all when empty).
func CheckSecretNamespace(namespaces []string, ns, name string) error {
	if len(namespaces) == 0 || slices.Contains(namespaces, ns) {
		return nil
	}
	return &ErrSecretNamespace{Namespace: ns, Name: name}
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
	// Secrets reads the Secrets CredentialSecrets selects, in Namespaces
	// (all when empty).
	Secrets    client.Reader
	Namespaces []string
}

// Of are r's credentials; the error names the Secret and what is wrong.
func (c ProxyCredentials) Of(ctx context.Context, r CredentialsRef) (proxyauth.Credentials, error) {
	switch {
	case r.Managed:
		return c.Key.Derive(r.UID), nil
	case r.Secret == "":
		return proxyauth.Credentials{}, nil
	case c.Secrets == nil:
		return proxyauth.Credentials{}, fmt.Errorf("Secret %s/%s: no credentials Secret is read here (the broker's --credentials-secrets=false: the chart's secretNamespaces is empty); keep it in a namespace listed there", r.Namespace, r.Secret)
	}
	if err := CheckSecretNamespace(c.Namespaces, r.Namespace, r.Secret); err != nil {
		return proxyauth.Credentials{}, err
	}
	var s corev1.Secret
	if err := c.Secrets.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Secret}, &s); err != nil {
		return proxyauth.Credentials{}, fmt.Errorf("reading Secret %s/%s (it must be labelled %s=true): %w", r.Namespace, r.Secret, v1.LabelProxyCredentials, err)
	}
	return proxyauth.FromSecret(&s)
}

// ParseNamespaces reads a comma-separated list of namespace names; ""
// is none. The error names the first bad one.
func ParseNamespaces(s string) ([]string, error) {
	var out []string
	for _, ns := range strings.Split(s, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return nil, fmt.Errorf("%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		out = append(out, ns)
	}
	return out, nil
}
