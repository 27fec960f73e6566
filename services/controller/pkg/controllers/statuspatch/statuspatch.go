// Package statuspatch is the deferred status write of the reconcilers
// that own a whole object's status (ProxyPool, ProxySource): a merge
// patch from the object as fetched, under optimistic lock, so a write
// computed from a stale read loses instead of undoing a newer one.
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

// Deferred writes obj's status, when changed, as a patch from base: a
// lost race requeues after ConflictRetry (unless the reconcile failed
// anyway), an object deleted meanwhile is nothing to write, any other
// error joins the reconcile's. Call it deferred, with the reconcile's
// named results.
func Deferred(ctx context.Context, c client.Client, base, obj client.Object, changed bool, res *ctrl.Result, retErr *error) {
	if !changed {
		return
	}
	err := c.Status().Patch(ctx, obj, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	switch {
	case apierrors.IsConflict(err):
		if *retErr == nil {
			*res = ctrl.Result{RequeueAfter: ConflictRetry}
		}
	case apierrors.IsNotFound(err):
	case err != nil:
		*retErr = errors.Join(*retErr, err)
	}
}
