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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// execute carries out p through the source's member set, keeps the
// remaining members' content in step with their entries, and records
// their exits. It decides nothing.
func (r *Reconciler) execute(ctx context.Context, src *v1.ProxySource, l limits, desired map[string]Entry, proxies map[string]*v1.Proxy, p plan, interval int32, now time.Time) error {
	set := &memberset.Set{Client: r.client, Recorder: r.recorder, Owner: src}
	hc := healthCheck(src, interval)
	mp := memberset.Plan{DrainUntil: memberset.DrainDeadline(now, l.drainTimeout)}
	for _, name := range p.delete {
		px := proxies[name]
		mp.Delete = append(mp.Delete, memberset.Change{Member: px, Why: entryOf(px) + " " + p.whyGone[name],
			After: func(ctx context.Context) error { return r.deleteCredentials(ctx, src, px.Namespace, px.Name) }})
	}
	for _, name := range p.drain {
		px := proxies[name]
		mp.Drain = append(mp.Drain, memberset.Change{Member: px, Why: entryOf(px) + " " + p.whyGone[name]})
	}
	for _, name := range p.undrain {
		px := proxies[name]
		mp.Undrain = append(mp.Undrain, memberset.Change{Member: px, Why: entryOf(px) + " is back in the source"})
	}
	for _, e := range p.create {
		px := newMember(src, e, hc)
		c := memberset.Change{Member: px, Why: "for " + e.Identity()}
		if e.Username != "" {
			c.Before = func(ctx context.Context) error { return r.createCredentials(ctx, src, px.Name, e) }
		}
		mp.Create = append(mp.Create, c)
	}
	errs := []error{set.Apply(ctx, mp)}
	for _, px := range proxies {
		e, ok := desired[px.Annotations[v1.AnnotationSourceEntry]]
		if ok && px.DeletionTimestamp.IsZero() && !slices.Contains(p.delete, px.Name) {
			errs = append(errs, r.syncMember(ctx, set, src, px, e, hc))
		}
	}
	errs = append(errs, r.recordExits(ctx, set, src, proxies), r.sweepSecrets(ctx, src, proxies, p))
	return errors.Join(errs...)
}

// entryOf names px's entry, for Events.
func entryOf(px *v1.Proxy) string { return "(" + px.Annotations[v1.AnnotationSourceEntry] + ")" }

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

// newMember is the External Proxy for e; the set makes it src's as it
// creates it.
func newMember(src *v1.ProxySource, e Entry, hc *v1.HealthCheck) *v1.Proxy {
	px := &v1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Name: memberName(src.Name, e), Namespace: src.Namespace,
			Labels: map[string]string{v1.LabelSource: src.Name}, Annotations: map[string]string{v1.AnnotationSourceEntry: e.Identity()}},
		Spec: v1.ProxySpec{Mode: v1.ModeExternal, Address: e.Host, Port: e.Port, Attributes: e.Attributes, HealthCheck: hc},
	}
	if e.Username != "" {
		px.Spec.CredentialsSecretRef = &v1.LocalSecretRef{Name: px.Name}
	}
	return px
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

// createCredentials writes e's credentials Secret for its member name,
// before the member, so it is never probed without them.
func (r *Reconciler) createCredentials(ctx context.Context, src *v1.ProxySource, name string, e Entry) error {
	s, err := r.credentials(src, name, e)
	if err == nil {
		err = client.IgnoreAlreadyExists(r.client.Create(ctx, s))
	}
	if err != nil {
		return fmt.Errorf("creating its credentials: %w", err)
	}
	return nil
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
func (r *Reconciler) syncMember(ctx context.Context, set *memberset.Set, src *v1.ProxySource, px *v1.Proxy, e Entry, hc *v1.HealthCheck) error {
	if !maps.Equal(px.Spec.Attributes, e.Attributes) || !equalHealth(px.Spec.HealthCheck, hc) {
		if err := set.Update(ctx, px, func(next *v1.Proxy) { next.Spec.Attributes, next.Spec.HealthCheck = e.Attributes, hc }); err != nil {
			return err
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
func (r *Reconciler) recordExits(ctx context.Context, set *memberset.Set, src *v1.ProxySource, proxies map[string]*v1.Proxy) error {
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
		if err := set.Update(ctx, px, func(next *v1.Proxy) {
			next.Annotations[v1.AnnotationExits] = strings.Join(append(exits, ip)[max(0, len(exits)+1-maxExits):], ",")
		}); err != nil {
			errs = append(errs, err)
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
