package leaseview

import (
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Wake carries ProxyPools to one reconciler outside its own watches: the
// pools it sends, and on every poll the pools that asked to follow polls
// (a rollout while members drain, the autoscaler for each pool it
// scales). Each reconciler owns one; the poller's polled hook calls
// Polled on each.
type Wake struct {
	ch chan event.GenericEvent

	mu   sync.Mutex
	keys map[types.NamespacedName]bool
}

// NewWake returns a wake with room for 1,024 pools in flight.
func NewWake() *Wake {
	return &Wake{ch: make(chan event.GenericEvent, 1024), keys: map[types.NamespacedName]bool{}}
}

// Source is the wake as a controller's source.
func (w *Wake) Source() source.Source {
	return source.Channel(w.ch, &handler.EnqueueRequestForObject{})
}

// Follow records whether the pool wants every poll.
func (w *Wake) Follow(key types.NamespacedName, polls bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if polls {
		w.keys[key] = true
	} else {
		delete(w.keys, key)
	}
}

// Polled sends the pools that follow polls. It never blocks.
func (w *Wake) Polled() {
	w.mu.Lock()
	keys := make([]types.NamespacedName, 0, len(w.keys))
	for key := range w.keys {
		keys = append(keys, key)
	}
	w.mu.Unlock()
	for _, key := range keys {
		w.Send(key)
	}
}

// Send enqueues a pool. It never blocks: when the channel is full the
// pool's own requeue is the fallback.
func (w *Wake) Send(key types.NamespacedName) {
	select {
	case w.ch <- event.GenericEvent{Object: &v1.ProxyPool{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
	default:
	}
}
