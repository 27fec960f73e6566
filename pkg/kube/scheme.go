// Package kube holds the Kubernetes plumbing every service shares.
package kube

import (
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"

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

// Controllers is the controller configuration every manager uses. The
// priority queue is off: in controller-runtime v0.24 a shutdown can park
// it forever (handleReadyItems sends to a consumer that left through the
// done channel, holding the lock every worker's Done needs; fixed
// upstream by #3540, first released in v0.25, which needs k8s.io v0.37),
// so a stopping manager waited out its whole grace period, and with
// LeaderElectionReleaseOnCancel the leader lease was held that long.
func Controllers() config.Controller {
	return config.Controller{UsePriorityQueue: ptr.To(false)}
}
