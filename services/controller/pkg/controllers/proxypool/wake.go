package proxypool

import (
	"context"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
)

// Wakeups carry pools to the rollout outside its own watches: the
// lease-view poller calls LeasesChanged and Polled, which are its hooks.
// The rollout wants a pool whose members' lease counts changed, and
// every poll while members drain (a drain ends on a count read after it
// began). Built before the rollout and the poller, it ties them without
// a cycle.
type Wakeups struct {
	reader client.Reader
	*leaseview.Wake
}

// NewWakeups returns wake-ups that read Proxies through reader (the
// manager's cache) to find their pools.
func NewWakeups(reader client.Reader) *Wakeups {
	return &Wakeups{reader: reader, Wake: leaseview.NewWake()}
}

// LeasesChanged wakes the rollout of the pools of the proxies (ids
// "namespace/name") whose live-lease count changed.
func (w *Wakeups) LeasesChanged(ids []string) {
	for _, id := range ids {
		ns, name, _ := strings.Cut(id, "/")
		px := &v1.Proxy{}
		if err := w.reader.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, px); err != nil {
			continue
		}
		if pool, ok := poolOf(px); ok {
			w.Send(pool)
		}
	}
}

// poolOf names the pool that controls o, if one does.
func poolOf(o client.Object) (types.NamespacedName, bool) {
	owner := metav1.GetControllerOf(o)
	if owner == nil || owner.Kind != "ProxyPool" || owner.APIVersion != v1.GroupVersion.String() {
		return types.NamespacedName{}, false
	}
	return types.NamespacedName{Namespace: o.GetNamespace(), Name: owner.Name}, true
}
