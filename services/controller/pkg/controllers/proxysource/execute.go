package proxysource

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/drain"
)

// execute carries out p, keeps the remaining members' content in step
// with their entries, and records their exits. It decides nothing.
func (r *Reconciler) execute(ctx context.Context, src *v1.ProxySource, l limits, desired map[string]Entry, proxies map[string]*v1.Proxy, p plan, interval int32, now time.Time) error {
	var errs []error
	for _, name := range p.delete {
		errs = append(errs, r.deleteMember(ctx, src, proxies[name], p.whyGone[name]))
	}
	deadline := drain.Deadline(now, l.drainTimeout)
	for _, name := range p.drain {
		errs = append(errs, r.drainMember(ctx, src, proxies[name], deadline, p.whyGone[name]))
	}
	for _, name := range p.undrain {
		errs = append(errs, r.undrainMember(ctx, src, proxies[name]))
	}
	hc := healthCheck(src, interval)
	errs = append(errs, r.createMembers(ctx, src, p.create, hc))
	for _, px := range proxies {
		e, ok := desired[px.Annotations[v1.AnnotationSourceEntry]]
		if ok && px.DeletionTimestamp.IsZero() && !slices.Contains(p.delete, px.Name) {
			errs = append(errs, r.syncMember(ctx, src, px, e, hc))
		}
	}
	errs = append(errs, r.recordExits(ctx, src, proxies), r.sweepSecrets(ctx, src, proxies, p))
	return errors.Join(errs...)
}

// healthCheck is the members' probe settings: the source's, with the
// interval a probe budget allows.
func healthCheck(src *v1.ProxySource, interval int32) *v1.HealthCheck {
	hc := src.Spec.HealthCheck.DeepCopy()
	if interval <= 0 {
		return hc
	}
	if hc == nil {
		hc = &v1.HealthCheck{}
	}
	hc.IntervalSeconds = max(hc.IntervalSeconds, interval)
	if hc.TimeoutSeconds >= hc.IntervalSeconds {
		hc.TimeoutSeconds = hc.IntervalSeconds - 1
	}
	return hc
}

// newMember is the External Proxy for e, owned by src.
func (r *Reconciler) newMember(src *v1.ProxySource, e Entry, hc *v1.HealthCheck) (*v1.Proxy, error) {
	px := &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: memberName(src.Name, e), Namespace: src.Namespace,
			Labels: map[string]string{v1.LabelSource: src.Name}, Annotations: map[string]string{v1.AnnotationSourceEntry: e.Identity()}},
		Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: e.Host, Port: e.Port, Attributes: e.Attributes, HealthCheck: hc},
	}
	if e.Username != "" {
		px.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: px.Name}
	}
	return px, controllerutil.SetControllerReference(src, px, r.client.Scheme())
}

// credentials is the Secret holding e's credentials, named as its member.
func (r *Reconciler) credentials(src *v1.ProxySource, name string, e Entry) (*corev1.Secret, error) {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: src.Namespace,
			Labels: map[string]string{v1.LabelProxyCredentials: "true", v1.LabelSource: src.Name}},
		Data: map[string][]byte{"username": []byte(e.Username), "password": []byte(e.Password)},
	}
	return s, controllerutil.SetControllerReference(src, s, r.client.Scheme())
}

// createMembers creates a member per entry, its credentials first so
// the member is never probed without them.
func (r *Reconciler) createMembers(ctx context.Context, src *v1.ProxySource, entries []Entry, hc *v1.HealthCheck) error {
	var errs []error
	var created []string
	for _, e := range entries {
		px, err := r.newMember(src, e, hc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if e.Username != "" {
			s, err := r.credentials(src, px.Name, e)
			if err == nil {
				err = r.client.Create(ctx, s)
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("creating the credentials of member %s: %w", px.Name, err))
				continue
			}
		}
		switch err := r.client.Create(ctx, px); {
		case err == nil:
			created = append(created, px.Name+" ("+e.Identity()+")")
		case !apierrors.IsAlreadyExists(err):
			errs = append(errs, fmt.Errorf("creating member %s for %s: %w", px.Name, e.Identity(), err))
		}
	}
	if len(created) > 0 {
		r.recorder.Eventf(src, nil, corev1.EventTypeNormal, v1.EventSourceAdded, "Create", "added %d members: %s", len(created), listed(created))
	}
	return errors.Join(errs...)
}

// listed joins names for an Event, the first ten of them.
func listed(names []string) string {
	if len(names) > 10 {
		return strings.Join(names[:10], ", ") + fmt.Sprintf(" and %d more", len(names)-10)
	}
	return strings.Join(names, ", ")
}

func (r *Reconciler) drainMember(ctx context.Context, src *v1.ProxySource, px *v1.Proxy, deadline time.Time, why string) error {
	next, err := drain.Begin(ctx, r.client, px, deadline)
	if err != nil {
		return fmt.Errorf("member %s: %w", px.Name, err)
	}
	r.recorder.Eventf(src, next, v1.EventType(v1.EventMemberDraining), v1.EventMemberDraining, "Drain",
		"member %s (%s) drains until %s: %s", px.Name, px.Annotations[v1.AnnotationSourceEntry], deadline.UTC().Format(time.RFC3339), why)
	return nil
}

// undrainMember takes back the drain of a member whose entry came back.
func (r *Reconciler) undrainMember(ctx context.Context, src *v1.ProxySource, px *v1.Proxy) error {
	next := px.DeepCopy()
	delete(next.Annotations, v1.AnnotationDrainDeadline)
	if err := r.client.Patch(ctx, next, client.MergeFromWithOptions(px, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("taking back the drain of member %s: %w", px.Name, err)
	}
	r.recorder.Eventf(src, next, corev1.EventTypeNormal, v1.EventSourceAdded, "Undrain", "member %s is back in the source; its drain is taken back", px.Name)
	return nil
}

// deleteMember deletes a drained member, then its credentials.
func (r *Reconciler) deleteMember(ctx context.Context, src *v1.ProxySource, px *v1.Proxy, why string) error {
	uid := px.UID
	if err := r.client.Delete(ctx, px, client.Preconditions{UID: &uid}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting member %s: %w", px.Name, err)
	}
	r.recorder.Eventf(src, px, v1.EventType(v1.EventMemberDeleted), v1.EventMemberDeleted, "Delete", "member %s deleted: %s", px.Name, why)
	return r.deleteCredentials(ctx, src, px.Namespace, px.Name)
}

// deleteCredentials deletes the credentials Secret the source made for
// member name, and only that: the Secret is found by the name the source
// gave it, never by the member's credentialsSecretRef (which whoever may
// edit Proxies can point anywhere), and it must be controlled by src.
func (r *Reconciler) deleteCredentials(ctx context.Context, src *v1.ProxySource, ns, name string) error {
	s, err := r.ownCredentials(ctx, src, ns, name)
	if s == nil || err != nil {
		return client.IgnoreNotFound(err)
	}
	if err := r.client.Delete(ctx, s, client.Preconditions{UID: &s.UID}); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting the credentials of member %s: %w", name, err)
	}
	return nil
}

// ownCredentials reads the Secret named name: nil when it is missing, an
// error naming it when src does not control it.
func (r *Reconciler) ownCredentials(ctx context.Context, src *v1.ProxySource, ns, name string) (*corev1.Secret, error) {
	var s corev1.Secret
	if err := r.sources.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		return nil, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(&s, src) {
		return nil, &foreignSecretError{Namespace: ns, Name: name, Source: src.Name}
	}
	return &s, nil
}

// foreignSecretError says a Secret where a member's credentials belong is
// not the source's: it is left alone, neither written nor deleted.
type foreignSecretError struct{ Namespace, Name, Source string }

func (e *foreignSecretError) Error() string {
	return fmt.Sprintf("Secret %s/%s is not controlled by ProxySource %s, so it is neither written nor deleted; delete or rename it to let the source keep its member's credentials there", e.Namespace, e.Name, e.Source)
}

// syncMember brings a member's mutable part (attributes, health check,
// password) to its entry's.
func (r *Reconciler) syncMember(ctx context.Context, src *v1.ProxySource, px *v1.Proxy, e Entry, hc *v1.HealthCheck) error {
	if !maps.Equal(px.Spec.Attributes, e.Attributes) || !equalHealth(px.Spec.HealthCheck, hc) {
		next := px.DeepCopy()
		next.Spec.Attributes, next.Spec.HealthCheck = e.Attributes, hc
		if err := client.IgnoreNotFound(r.client.Patch(ctx, next, client.MergeFrom(px))); err != nil {
			return fmt.Errorf("updating member %s: %w", px.Name, err)
		}
	}
	if e.Username == "" {
		return nil
	}
	s, err := r.ownCredentials(ctx, src, px.Namespace, px.Name)
	switch {
	case err != nil:
		return fmt.Errorf("member %s: %w", px.Name, err)
	case s == nil:
		want, err := r.credentials(src, px.Name, e)
		if err == nil {
			err = client.IgnoreAlreadyExists(r.client.Create(ctx, want))
		}
		return err
	case string(s.Data["password"]) == e.Password && string(s.Data["username"]) == e.Username:
		return nil
	}
	next := s.DeepCopy()
	next.Data = map[string][]byte{"username": []byte(e.Username), "password": []byte(e.Password)}
	if err := r.client.Patch(ctx, next, client.MergeFromWithOptions(s, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("updating the credentials of member %s: %w", px.Name, err)
	}
	return nil
}

func equalHealth(a, b *v1.HealthCheck) bool {
	return (a == nil) == (b == nil) && (a == nil || *a == *b)
}

// maxExits bounds the exits a member's annotation keeps.
const maxExits = 8

// recordExits notes each healthy member's exit IP in its exits
// annotation; a move from an earlier one is counted and told in an
// Event: a vendor rotating the session's exit.
func (r *Reconciler) recordExits(ctx context.Context, src *v1.ProxySource, proxies map[string]*v1.Proxy) error {
	var errs []error
	for _, px := range proxies {
		ip := px.Status.EgressIP
		if ip == "" || !px.Status.IsHealthy() || !px.DeletionTimestamp.IsZero() {
			continue
		}
		var exits []string
		if v := px.Annotations[v1.AnnotationExits]; v != "" {
			exits = strings.Split(v, ",")
		}
		if len(exits) > 0 && exits[len(exits)-1] == ip {
			continue
		}
		next := px.DeepCopy()
		next.Annotations[v1.AnnotationExits] = strings.Join(append(exits, ip)[max(0, len(exits)+1-maxExits):], ",")
		if err := r.client.Patch(ctx, next, client.MergeFrom(px)); err != nil {
			errs = append(errs, client.IgnoreNotFound(err))
			continue
		}
		if len(exits) > 0 {
			src.Status.ExitChanges++
			r.recorder.Eventf(src, px, corev1.EventTypeNormal, v1.EventSourceExitChanged, "Probe",
				"member %s (%s) exits from %s, no longer %s", px.Name, px.Annotations[v1.AnnotationSourceEntry], ip, exits[len(exits)-1])
		}
	}
	return errors.Join(errs...)
}

// sweepGrace is how old a Secret no member names must be to be swept: a
// member created a moment ago may not be in the cache yet.
const sweepGrace = time.Minute

// sweepSecrets deletes credential Secrets of the source that no member
// names: left by a crash between a Proxy's deletion and its Secret's, or
// between a Secret's creation and its Proxy's.
func (r *Reconciler) sweepSecrets(ctx context.Context, src *v1.ProxySource, proxies map[string]*v1.Proxy, p plan) error {
	var list corev1.SecretList
	if err := r.sources.List(ctx, &list, client.InNamespace(src.Namespace), client.MatchingLabels{v1.LabelSource: src.Name}); err != nil {
		return err
	}
	wanted := map[string]bool{}
	for _, e := range p.create {
		wanted[memberName(src.Name, e)] = true
	}
	var errs []error
	for i := range list.Items {
		s := &list.Items[i]
		if _, ok := proxies[s.Name]; ok || wanted[s.Name] || !metav1.IsControlledBy(s, src) || slices.Contains(p.delete, s.Name) ||
			r.opts.Clock.Since(s.CreationTimestamp.Time) < sweepGrace {
			continue
		}
		errs = append(errs, client.IgnoreNotFound(r.client.Delete(ctx, s, client.Preconditions{UID: &s.UID})))
	}
	return errors.Join(errs...)
}
