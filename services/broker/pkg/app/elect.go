package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Timings of the tenant-status Lease: client-go's defaults. A hand-over
// delays a status write by at most leaseDuration; nothing else waits on
// the leader.
const (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// elect runs for the Lease name in namespace until ctx ends, as often as
// it is lost, and reports whether this broker holds it now: the one
// broker that writes the Tenants' status, as the controller's leader is
// the one that writes the Proxies'.
func elect(ctx context.Context, log *slog.Logger, cfg *rest.Config, namespace, name string) (func() bool, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the Lease client: %w", err)
	}
	host, _ := os.Hostname()
	id := host + "_" + rand.String(8)
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	var leading atomic.Bool
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
		ReleaseOnCancel: true, Name: name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) {
				leading.Store(true)
				log.Info("writing the Tenants' status", "lease", namespace+"/"+name, "identity", id)
			},
			OnStoppedLeading: func() { leading.Store(false) },
		},
	})
	if err != nil {
		return nil, fmt.Errorf("--tenant-status-lease: %w", err)
	}
	go func() {
		for ctx.Err() == nil {
			le.Run(ctx) // returns when leadership is lost
		}
	}()
	return leading.Load, nil
}
