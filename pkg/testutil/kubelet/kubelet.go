// Package kubelet plays the kubelet for the kubernetes provider's Squid
// pods where none runs (envtest, the demo): for every pod of ours it starts
// a real Squid on an address of its own (127.A.B.10, .11, ..., in a /24
// picked at random per stand-in, so stand-ins of tests running in parallel
// never share one) and the pod's container port, and writes the status a
// kubelet would: Running, with that address as the pod IP. Nothing else
// ever runs on those addresses. A deleted pod's Squid is stopped. It is
// the one stand-in kubelet of every test and the demo.
package kubelet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/pkg/proxyauth"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// StandIn is the stand-in kubelet for one namespace.
type StandIn struct {
	Client    client.Client
	Namespace string
	T         proc.T
	// Log, when set, hears every pod started and stopped.
	Log func(format string, args ...any)
	// AddressOnly gives each pod its address and starts nothing there, for
	// tests of the controller's bookkeeping that send no traffic.
	AddressOnly bool

	mu      sync.Mutex
	running map[string]*proc.Squid
	next    int
	subnet  string // "127.A.B"
}

// Run reconciles every interval until ctx ends.
func (k *StandIn) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		k.Sync(ctx)
		select {
		case <-ctx.Done():
			k.stopAll()
			return
		case <-t.C:
		}
	}
}

func (k *StandIn) logf(format string, args ...any) {
	if k.Log != nil {
		k.Log(format, args...)
	}
}

// Sync runs every pod that waits for it, once.
func (k *StandIn) Sync(ctx context.Context) {
	pods := &corev1.PodList{}
	if err := k.Client.List(ctx, pods, client.InNamespace(k.Namespace), client.MatchingLabels{"app.kubernetes.io/managed-by": "egress-proxies"}); err != nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.running == nil {
		k.running = map[string]*proc.Squid{}
		k.subnet = fmt.Sprintf("127.%d.%d", 1+rand.IntN(250), rand.IntN(250))
	}
	seen := map[string]bool{}
	for i := range pods.Items {
		pod := &pods.Items[i]
		uid := string(pod.UID)
		seen[uid] = true
		if pod.DeletionTimestamp != nil || pod.Status.PodIP != "" || k.running[uid] != nil {
			continue
		}
		port := 3128
		if c := pod.Spec.Containers; len(c) > 0 && len(c[0].Ports) > 0 {
			port = int(c[0].Ports[0].ContainerPort)
		}
		// As a kubelet, a pod mounting a Secret that does not exist yet
		// waits for it.
		creds, ok := k.credentials(ctx, pod)
		if !ok {
			continue
		}
		k.next++
		host := fmt.Sprintf("%s.%d", k.subnet, 9+k.next)
		if k.AddressOnly {
			_ = MarkRunning(ctx, k.Client, pod, host) // retried at the next Sync
			continue
		}
		var squid *proc.Squid
		if !creds.Empty() {
			squid = proc.StartSquidWithAuthAt(k.T, host, port, creds.Username, creds.Password)
		} else {
			squid = proc.StartSquidAt(k.T, host, port, false)
		}
		if err := MarkRunning(ctx, k.Client, pod, host); err != nil {
			squid.Kill()
			continue
		}
		k.running[uid] = squid
		k.logf("kubelet stand-in: pod %s/%s runs Squid at %s", pod.Namespace, pod.Name, squid.Addr)
	}
	for uid, squid := range k.running {
		if !seen[uid] {
			squid.Kill()
			delete(k.running, uid)
			k.logf("kubelet stand-in: pod gone, stopped Squid at %s", squid.Addr)
		}
	}
}

// credentials are what the pod's mounted credentials Secret holds (the
// kubernetes provider's); ok is false while a Secret it mounts is
// missing, as a kubelet keeps such a pod waiting.
func (k *StandIn) credentials(ctx context.Context, pod *corev1.Pod) (c proxyauth.Credentials, ok bool) {
	for _, v := range pod.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		var s corev1.Secret
		if err := k.Client.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: v.Secret.SecretName}, &s); err != nil {
			return proxyauth.Credentials{}, false
		}
		if creds, err := proxyauth.FromSecret(&s); err == nil {
			c = creds
		}
	}
	return c, true
}

// MarkRunning writes the status a kubelet writes once pod runs at ip.
func MarkRunning(ctx context.Context, c client.Client, pod *corev1.Pod, ip string) error {
	pod.Status.Phase = corev1.PodRunning
	pod.Status.PodIP = ip
	pod.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	return c.Status().Update(ctx, pod)
}

func (k *StandIn) stopAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for uid, s := range k.running {
		s.Kill()
		delete(k.running, uid)
	}
}

// Squid returns the Squid running for the pod with this UID, or nil.
func (k *StandIn) Squid(podUID string) *proc.Squid {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.running[podUID]
}
