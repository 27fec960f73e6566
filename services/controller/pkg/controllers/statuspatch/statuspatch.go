// Package statuspatch is the status write of the controller's
// reconcilers (the Proxy lifecycle, ProxyPool, ProxySource): a merge
// patch from the object as fetched, under optimistic lock, so a write
// computed from a stale read loses instead of undoing a newer one, and
// what a lost race means for the reconcile.
package statuspatch

import (
	"context"
	"errors"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// ConflictRetry is how soon a reconcile whose status write lost an
// optimistic-lock race runs again.
const ConflictRetry = 100 * time.Millisecond

// Patch writes obj's status as a patch from base; wrote is false when
// the object was deleted meanwhile, which is nothing to write.
func Patch(ctx context.Context, c client.Client, base, obj client.Object) (wrote bool, err error) {
	err = c.Status().Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Settle folds a deferred status write's error into the reconcile's
// named results: a lost race (someone, often the previous reconcile
// through a cache that had not caught up, wrote first) requeues after
// ConflictRetry to decide again on a fresh read, unless the reconcile
// failed anyway; any other error joins the reconcile's.
func Settle(err error, res *ctrl.Result, retErr *error) {
	switch {
	case apierrors.IsConflict(err):
		if *retErr == nil {
			*res = ctrl.Result{RequeueAfter: ConflictRetry}
		}
	case err != nil:
		*retErr = errors.Join(*retErr, err)
	}
}

// Deferred is Patch when changed, then Settle: the whole deferred write
// of a reconciler that owns an object's status.
func Deferred(ctx context.Context, c client.Client, base, obj client.Object, changed bool, res *ctrl.Result, retErr *error) {
	if !changed {
		return
	}
	_, err := Patch(ctx, c, base, obj)
	Settle(err, res, retErr)
}
