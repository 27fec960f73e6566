package proxypool

import (
	"context"
	"strings"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Wakeups carry pools to their reconcilers outside the reconcilers' own
// watches: the lease-view poller calls LeasesChanged and Polled, which
// are its hooks. The rollout wants a pool whose members' lease counts
// changed, and every poll while members drain (a drain ends on a count
// read after it began); the autoscaler wants every poll for each pool it
// scales (demand may have changed anywhere). Built before both
// reconcilers and the poller, it is what ties them without a cycle.
type Wakeups struct {
	reader    client.Reader
	rollout   chan event.GenericEvent
	autoscale chan event.GenericEvent

	mu         sync.Mutex
	draining   map[types.NamespacedName]bool
	autoscaled map[types.NamespacedName]bool
}

// NewWakeups returns wake-ups that read Proxies through reader (the
// manager's cache) to find their pools.
func NewWakeups(reader client.Reader) *Wakeups {
	return &Wakeups{
		reader: reader, rollout: make(chan event.GenericEvent, 1024), autoscale: make(chan event.GenericEvent, 1024),
		draining: map[types.NamespacedName]bool{}, autoscaled: map[types.NamespacedName]bool{},
	}
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
			send(w.rollout, pool)
		}
	}
}

// Polled wakes the pools that follow every poll. It never blocks.
func (w *Wakeups) Polled() {
	w.mu.Lock()
	var rollout, autoscale []types.NamespacedName
	for key := range w.draining {
		rollout = append(rollout, key)
	}
	for key := range w.autoscaled {
		autoscale = append(autoscale, key)
	}
	w.mu.Unlock()
	for _, key := range rollout {
		send(w.rollout, key)
	}
	for _, key := range autoscale {
		send(w.autoscale, key)
	}
}

// follow records whether the pool wants every poll, for one of the sets.
func (w *Wakeups) follow(set map[types.NamespacedName]bool, key types.NamespacedName, polls bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if polls {
		set[key] = true
	} else {
		delete(set, key)
	}
}

// send enqueues a pool. It never blocks: when the channel is full the
// pool's own requeue is the fallback.
func send(ch chan event.GenericEvent, key types.NamespacedName) {
	select {
	case ch <- event.GenericEvent{Object: &v1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	default:
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
