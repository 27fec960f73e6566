package kube

import (
	toolscache "k8s.io/client-go/tools/cache"

	crawlv1alpha1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// ProxyEvents turns a Proxy informer's events into two calls: set for a
// Proxy added or changed, gone for one deleted, including one whose
// deletion the informer only learned from a relist.
func ProxyEvents(set, gone func(*crawlv1alpha1.Proxy)) toolscache.ResourceEventHandlerFuncs {
	asProxy := func(o any, f func(*crawlv1alpha1.Proxy)) {
		if d, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
			o = d.Obj
		}
		if px, ok := o.(*crawlv1alpha1.Proxy); ok {
			f(px)
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { asProxy(o, set) },
		UpdateFunc: func(_, o any) { asProxy(o, set) },
		DeleteFunc: func(o any) { asProxy(o, gone) },
	}
}
