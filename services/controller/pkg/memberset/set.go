// Package memberset owns the Proxies one owner controls (a ProxyPool's
// members, a ProxySource's), as Cluster API's MachineSet owns the Machines
// of a MachineDeployment: it reads them, and carries out what the owner
// decided (create, drain, undrain, delete, change in place), telling each
// in an Event on the owner. The set decides nothing; an owner keeps only
// its decisions, so a new kind that makes Proxies needs nothing else.
package memberset

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Set carries out an owner's decisions about its members.
type Set struct {
	// Client writes, and reads through the manager's cache.
	Client   client.Client
	Recorder events.EventRecorder
	// Owner controls every member: each is created with its controller
	// reference, so none ever exists unowned.
	Owner client.Object
	// Wait has each write waited for in the cache, so the owner's next
	// reconcile decides on a view that holds it.
	Wait bool
	// Workers bounds the creates in flight (0 or 1: one at a time).
	Workers int
	// Done, when set, is told of each change that went through, with its
	// cause: the owner's decision metrics.
	Done func(a Action, cause string)
}

// Action is one kind of change a set makes.
type Action string

// The actions.
const (
	Create  Action = "create"
	Drain   Action = "drain"
	Undrain Action = "undrain"
	Delete  Action = "delete"
)

// Change is one decision about one member.
type Change struct {
	// Member is the member changed: the one to create (its name and
	// content decided by the owner), or the one read to drain, undrain or
	// delete.
	Member *v1.Proxy
	// Why is said in the change's Event; Cause is given to Done.
	Why, Cause string
	// Before runs before a create (the member's credentials are written
	// first, so it is never probed without them); After after a delete
	// (its credentials go with it). Either failing fails the change.
	Before, After func(context.Context) error
}

// Plan is what an owner decided, carried out as deletes, drains (until
// DrainUntil), undrains, then creates.
type Plan struct {
	Delete, Drain, Undrain, Create []Change
	DrainUntil                     time.Time
}

// Apply carries out p. An error of one change does not stop the others;
// all are returned.
func (s *Set) Apply(ctx context.Context, p Plan) error {
	var errs []error
	for _, c := range p.Delete {
		errs = append(errs, s.done(Delete, c, s.delete(ctx, c)))
	}
	for _, c := range p.Drain {
		errs = append(errs, s.done(Drain, c, s.drain(ctx, c, p.DrainUntil)))
	}
	for _, c := range p.Undrain {
		errs = append(errs, s.done(Undrain, c, s.undrain(ctx, c)))
	}
	return errors.Join(append(errs, s.create(ctx, p.Create))...)
}

func (s *Set) done(a Action, c Change, err error) error {
	if err == nil && s.Done != nil {
		s.Done(a, c.Cause)
	}
	return err
}

// Update changes px in place as change says, unless it is gone: the
// owner's content reaching a member it keeps.
func (s *Set) Update(ctx context.Context, px *v1.Proxy, change func(*v1.Proxy)) error {
	next := px.DeepCopy()
	change(next)
	if err := client.IgnoreNotFound(s.Client.Patch(ctx, next, client.MergeFrom(px))); err != nil {
		return fmt.Errorf("updating member %s: %w", px.Name, err)
	}
	return nil
}

func (s *Set) drain(ctx context.Context, c Change, until time.Time) error {
	px := c.Member
	next, err := beginDrain(ctx, s.Client, px, until)
	if err != nil {
		return fmt.Errorf("member %s: %w", px.Name, err)
	}
	s.Recorder.Eventf(s.Owner, next, v1.EventType(v1.EventMemberDraining), v1.EventMemberDraining, "Drain",
		"member %s drains until %s: %s", px.Name, until.UTC().Format(time.RFC3339), c.Why)
	return s.waitFor(ctx, px, func(c *v1.Proxy) bool {
		if c == nil {
			return true
		}
		_, ok := c.Annotations[v1.AnnotationDrainDeadline]
		return ok
	})
}

// undrain takes a drain back, under optimistic lock.
func (s *Set) undrain(ctx context.Context, c Change) error {
	px := c.Member
	next := px.DeepCopy()
	delete(next.Annotations, v1.AnnotationDrainDeadline)
	if err := s.Client.Patch(ctx, next, client.MergeFromWithOptions(px, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("taking back the drain of member %s: %w", px.Name, err)
	}
	s.Recorder.Eventf(s.Owner, next, corev1.EventTypeNormal, v1.EventMemberUndrained, "Undrain", "member %s: its drain is taken back: %s", px.Name, c.Why)
	return s.waitFor(ctx, px, func(c *v1.Proxy) bool {
		if c == nil {
			return true
		}
		_, draining := c.Annotations[v1.AnnotationDrainDeadline]
		return !draining
	})
}

// delete deletes the member it was decided about, and not one re-created
// under its name since.
func (s *Set) delete(ctx context.Context, c Change) error {
	px := c.Member
	uid := px.UID
	if err := s.Client.Delete(ctx, px, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting member %s: %w", px.Name, err)
	}
	s.Recorder.Eventf(s.Owner, px, v1.EventType(v1.EventMemberDeleted), v1.EventMemberDeleted, "Delete", "member %s deleted: %s", px.Name, c.Why)
	if c.After != nil {
		if err := c.After(ctx); err != nil {
			return fmt.Errorf("member %s: %w", px.Name, err)
		}
	}
	return s.waitFor(ctx, px, func(c *v1.Proxy) bool { return c == nil || !c.DeletionTimestamp.IsZero() })
}

// create creates the members, Workers at a time, each owned by Owner. A
// member that already exists (a retry on the same view) counts as
// written, not created.
func (s *Set) create(ctx context.Context, cs []Change) error {
	if len(cs) == 0 {
		return nil
	}
	var g errgroup.Group
	g.SetLimit(max(s.Workers, 1))
	var mu sync.Mutex
	// written: members that exist now; whys: the created ones, for the
	// Event; errs: the creates that failed, which stop no other.
	var written []*v1.Proxy
	var whys []string
	var errs []error
	for _, c := range cs {
		g.Go(func() error {
			px := c.Member
			err := s.createOne(ctx, c)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case apierrors.IsAlreadyExists(err):
				written = append(written, px)
			case err != nil:
				errs = append(errs, err)
			default:
				written = append(written, px)
				whys = append(whys, px.Name+" "+c.Why)
				if s.Done != nil {
					s.Done(Create, c.Cause)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	err := errors.Join(errs...)
	// The creates went out together; now the cache must hold what they
	// wrote (it gets them in order, so the first waits for most of them).
	for _, px := range written {
		err = errors.Join(err, s.waitFor(ctx, px, func(c *v1.Proxy) bool { return c != nil }))
	}
	if len(whys) > 0 {
		sort.Strings(whys)
		s.Recorder.Eventf(s.Owner, nil, v1.EventType(v1.EventMemberCreated), v1.EventMemberCreated, "Create",
			"created %d members: %s", len(whys), listed(whys))
	}
	return err
}

// createOne writes what must come first, then c's member, owned by
// Owner. AlreadyExists is returned as is: a retry on the same view.
func (s *Set) createOne(ctx context.Context, c Change) error {
	px := c.Member
	if err := controllerutil.SetControllerReference(s.Owner, px, s.Client.Scheme()); err != nil {
		return err
	}
	if c.Before != nil {
		if err := c.Before(ctx); err != nil {
			return fmt.Errorf("member %s: %w", px.Name, err)
		}
	}
	err := s.Client.Create(ctx, px)
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating member %s: %w", px.Name, err)
	}
	return err
}

// listed joins an Event's items, the first ten of them.
func listed(items []string) string {
	if len(items) > 10 {
		return strings.Join(items[:10], "; ") + fmt.Sprintf("; and %d more", len(items)-10)
	}
	return strings.Join(items, "; ")
}

// cacheWait bounds how long a write may take to reach the cache.
const cacheWait = 10 * time.Second

// waitFor polls the cache, when the set waits, until ok holds for px as
// it has it (nil when absent).
func (s *Set) waitFor(ctx context.Context, px *v1.Proxy, ok func(*v1.Proxy) bool) error {
	if !s.Wait {
		return nil
	}
	key := client.ObjectKeyFromObject(px)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, cacheWait, true, func(ctx context.Context) (bool, error) {
		got := &v1.Proxy{}
		err := s.Client.Get(ctx, key, got)
		switch {
		case apierrors.IsNotFound(err):
			return ok(nil), nil
		case err != nil:
			last = err
			return false, nil
		}
		return ok(got), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the cache to see member %s: %w", key.Name, errors.Join(err, last))
	}
	return nil
}

// Members are the Proxies of owner's namespace that owner controls, by
// name, and every name taken in the namespace (a new member needs a free
// one), read from r with opts (a label selector narrows the list).
func Members(ctx context.Context, r client.Reader, owner client.Object, opts ...client.ListOption) (map[string]*v1.Proxy, map[string]bool, error) {
	list := &v1.ProxyList{}
	if err := r.List(ctx, list, append([]client.ListOption{client.InNamespace(owner.GetNamespace()), client.UnsafeDisableDeepCopy}, opts...)...); err != nil {
		return nil, nil, fmt.Errorf("listing the Proxies of namespace %s: %w", owner.GetNamespace(), err)
	}
	members, taken := map[string]*v1.Proxy{}, make(map[string]bool, len(list.Items))
	for i := range list.Items {
		px := &list.Items[i]
		taken[px.Name] = true
		if metav1.IsControlledBy(px, owner) {
			members[px.Name] = px
		}
	}
	return members, taken, nil
}
