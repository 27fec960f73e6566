// Package kube holds the Kubernetes plumbing every service shares.
package kube

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"

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

// RestConfig loads the kubeconfig at path, or, when path is empty, the
// in-cluster config or $KUBECONFIG (controller-runtime's rules).
func RestConfig(path string) (*rest.Config, error) {
	if path == "" {
		return ctrl.GetConfig()
	}
	return clientcmd.BuildConfigFromFlags("", path)
}
