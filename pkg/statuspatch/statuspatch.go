// Package statuspatch is the one status write of every writer declared
// in v1alpha1.StatusWriters: a merge patch from the object as read,
// under optimistic lock, refused when it touches a field or condition
// type the writer does not own.
//
// A lost race is resolved per owned field, as Cluster API's patch helper
// does with owned conditions: if the winner changed only what others own
// (the lifecycle and the health engine share a Proxy's status), the
// write is laid on the live object and sent again; if it changed what
// this writer owns, the writer decided on a stale read of its own
// fields, and the conflict is returned so the reconcile decides again.
//
// The patch names no field manager per writer: the API server keeps a
// managed-fields entry per manager, a sixth more work per write
// (BenchmarkStatusWrites, decision 130), for attribution the
// declaration already gives.
package statuspatch

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// ConflictRetry is how soon a reconcile whose status write lost a race
// on its own fields runs again.
const ConflictRetry = 100 * time.Millisecond

// NotOwnedError is a write outside the writer's declaration: a bug in
// the writer, refused before anything is sent.
type NotOwnedError struct {
	Writer, Kind string
	// Field is the status field, or conditions[Type].
	Field string
}

func (e *NotOwnedError) Error() string {
	return fmt.Sprintf("status writer %q does not own %s status.%s (v1alpha1.StatusWriters declares what it owns)", e.Writer, e.Kind, e.Field)
}

// IsNotOwned reports whether err is a write outside the writer's fields.
func IsNotOwned(err error) bool {
	var e *NotOwnedError
	return errors.As(err, &e)
}

// Helper is one writer's status patch.
type Helper struct {
	Writer v1.StatusWriter
	// Client writes, and reads the live object after a lost race: a
	// cache behind the winner makes the next write lose too, which is
	// returned as the conflict it is.
	Client client.Client
}

// New is the helper of writer w.
func New(w v1.StatusWriter, c client.Client) Helper {
	return Helper{Writer: w, Client: c}
}

// Patch writes obj's status as a patch from base, when it changed.
// wrote is false when nothing changed or the object is gone.
func (h Helper) Patch(ctx context.Context, base, obj client.Object) (wrote bool, err error) {
	// Most reconciles change nothing: the typed comparison is what they
	// cost, not two conversions.
	if equality.Semantic.DeepEqual(statusField(base), statusField(obj)) {
		return false, nil
	}
	old, err := statusOf(base)
	if err != nil {
		return false, err
	}
	cur, err := statusOf(obj)
	if err != nil {
		return false, err
	}
	changed, err := h.check(old, cur)
	if err != nil || !changed {
		return false, err
	}
	err = h.Client.Status().Patch(ctx, obj, locked(base))
	if apierrors.IsConflict(err) {
		err = h.again(ctx, old, cur, obj, err)
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Write is a reconcile's status write: the generation observed when the
// reconcile succeeded (and the object is not being deleted), then Patch.
func (h Helper) Write(ctx context.Context, base, obj client.Object, succeeded bool) (wrote bool, err error) {
	if o, ok := obj.(v1.Observer); ok && succeeded && obj.GetDeletionTimestamp().IsZero() && h.Writer.Owns("observedGeneration") {
		o.Observe()
	}
	return h.Patch(ctx, base, obj)
}

// Deferred is Write, then FoldInto: the deferred status write of a
// reconciler that needs nothing else of it.
func (h Helper) Deferred(ctx context.Context, base, obj client.Object, res *ctrl.Result, retErr *error) {
	_, err := h.Write(ctx, base, obj, *retErr == nil)
	FoldInto(err, res, retErr)
}

// FoldInto folds a deferred status write's error into the reconcile's
// named results: a lost race requeues after ConflictRetry to decide
// again on a fresh read, unless the reconcile failed anyway; any other
// error joins the reconcile's.
func FoldInto(err error, res *ctrl.Result, retErr *error) {
	switch {
	case apierrors.IsConflict(err):
		if *retErr == nil {
			*res = ctrl.Result{RequeueAfter: ConflictRetry}
		}
	case err != nil:
		*retErr = errors.Join(*retErr, err)
	}
}

// check reports whether the status changed, refusing a change the
// writer does not own.
func (h Helper) check(old, cur map[string]any) (bool, error) {
	changed := false
	for _, f := range keys(old, cur) {
		if f == "conditions" {
			was, is := conditionsOf(old), conditionsOf(cur)
			for _, t := range keys(was, is) {
				if equality.Semantic.DeepEqual(was[t], is[t]) {
					continue
				}
				if !h.Writer.OwnsCondition(t) {
					return false, &NotOwnedError{Writer: h.Writer.Name, Kind: h.Writer.Kind, Field: "conditions[" + t + "]"}
				}
				changed = true
			}
			continue
		}
		if equality.Semantic.DeepEqual(old[f], cur[f]) {
			continue
		}
		if !h.Writer.Owns(f) {
			return false, &NotOwnedError{Writer: h.Writer.Name, Kind: h.Writer.Kind, Field: f}
		}
		changed = true
	}
	return changed, nil
}

// again sends the write once more on the live object when the race was
// lost to another writer's fields only; lost is returned otherwise.
func (h Helper) again(ctx context.Context, old, cur map[string]any, obj client.Object, lost error) error {
	live := obj.DeepCopyObject().(client.Object)
	if err := h.Client.Get(ctx, client.ObjectKeyFromObject(obj), live); err != nil {
		return err
	}
	now, err := statusOf(live)
	if err != nil {
		return err
	}
	if !equality.Semantic.DeepEqual(h.owned(now), h.owned(old)) {
		return lost
	}
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(live)
	if err != nil {
		return err
	}
	u["status"] = h.lay(now, cur)
	next := live.DeepCopyObject().(client.Object)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u, next); err != nil {
		return err
	}
	return h.Client.Status().Patch(ctx, next, locked(live))
}

// owned is the part of status st that the writer owns.
func (h Helper) owned(st map[string]any) map[string]any {
	out := map[string]any{}
	for f, v := range st {
		if f != "conditions" && h.Writer.Owns(f) {
			out[f] = v
		}
	}
	for t, c := range conditionsOf(st) {
		if h.Writer.OwnsCondition(t) {
			out["conditions["+t+"]"] = c
		}
	}
	return out
}

// lay is status now with what the writer owns taken from mine;
// conditions keep now's order, the writer's new types after.
func (h Helper) lay(now, mine map[string]any) map[string]any {
	out := map[string]any{}
	for f, v := range now {
		if !h.Writer.Owns(f) {
			out[f] = v
		}
	}
	for f, v := range mine {
		if f != "conditions" && h.Writer.Owns(f) {
			out[f] = v
		}
	}
	var conds []any
	seen := map[string]bool{}
	mineByType := conditionsOf(mine)
	for _, c := range asList(now["conditions"]) {
		t := typeOf(c)
		seen[t] = true
		if !h.Writer.OwnsCondition(t) {
			conds = append(conds, c)
		} else if m, ok := mineByType[t]; ok {
			conds = append(conds, m)
		}
	}
	for _, c := range asList(mine["conditions"]) {
		if t := typeOf(c); !seen[t] && h.Writer.OwnsCondition(t) {
			conds = append(conds, c)
		}
	}
	if conds != nil {
		out["conditions"] = conds
	}
	return out
}

func locked(base client.Object) client.Patch {
	return client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})
}

// statusField is o's Status field, addressed: every kind a writer is
// declared for has one.
func statusField(o client.Object) any {
	return reflect.ValueOf(o).Elem().FieldByName("Status").Addr().Interface()
}

// statusOf is o's status as JSON would have it.
func statusOf(o client.Object) (map[string]any, error) {
	st, err := runtime.DefaultUnstructuredConverter.ToUnstructured(statusField(o))
	if err != nil {
		return nil, fmt.Errorf("reading %T's status: %w", o, err)
	}
	return st, nil
}

func conditionsOf(st map[string]any) map[string]any {
	out := map[string]any{}
	for _, c := range asList(st["conditions"]) {
		out[typeOf(c)] = c
	}
	return out
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func typeOf(c any) string {
	m, _ := c.(map[string]any)
	t, _ := m["type"].(string)
	return t
}

func keys(a, b map[string]any) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
