// Package kube holds the Kubernetes plumbing every service shares.
package kube

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"

	crawlv1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// NewScheme returns a scheme with the built-in types, CRDs and the Proxy API.
func NewScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, crawlv1alpha1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}
