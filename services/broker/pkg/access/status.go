package access

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/statuspatch"
)

// DefaultStatusInterval is how often each broker records whom it served
// and the leader writes the Tenants' status.
const DefaultStatusInterval = 30 * time.Second

// Fleet is what every broker shares about the tenants: their live leases,
// and when any broker last served each (the store).
type Fleet interface {
	TenantLeases(ctx context.Context) (map[string]int64, error)
	// Seen records this broker's last call by each tenant, keeping the
	// later of each broker's.
	Seen(ctx context.Context, seen map[string]time.Time, now time.Time) error
	LastSeen(ctx context.Context) (map[string]time.Time, error)
}

// StatusWriter keeps each Tenant's status: Ready (its credentials read),
// its live leases fleet-wide, and when a broker last served it. Every
// broker records whom it served in the shared store; one writes the
// status (v1.WriterTenant), the one leading the status Lease, from what
// the store says of them all.
type StatusWriter struct {
	Client   client.Client
	Registry *Registry
	Fleet    Fleet
	// Leading reports whether this broker writes the status now; nil is
	// always (a single broker).
	Leading  func() bool
	Interval time.Duration
	Log      *slog.Logger
}

// Run records and writes every Interval until ctx ends.
func (w *StatusWriter) Run(ctx context.Context) {
	t := time.NewTicker(w.Interval)
	defer t.Stop()
	for {
		if err := w.tick(ctx); err != nil && ctx.Err() == nil {
			w.Log.Warn("keeping the Tenants' status", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (w *StatusWriter) tick(ctx context.Context) error {
	if err := w.Fleet.Seen(ctx, w.Registry.Seen(), w.Registry.clock().Now()); err != nil {
		return fmt.Errorf("recording whom this broker served: %w", err)
	}
	if w.Leading != nil && !w.Leading() {
		return nil
	}
	return w.write(ctx)
}

func (w *StatusWriter) write(ctx context.Context) error {
	leases, err := w.Fleet.TenantLeases(ctx)
	if err != nil {
		return err
	}
	seen, err := w.Fleet.LastSeen(ctx)
	if err != nil {
		return err
	}
	var errs []string
	for _, d := range w.Registry.Declared() {
		want := Status(d, leases[d.Tenant.Name], seen[d.Tenant.Name])
		if equality.Semantic.DeepEqual(want, d.Object.Status) {
			continue
		}
		o := d.Object.DeepCopy()
		o.Status = want
		// A conflict is a write by the leader before this one (a
		// hand-over); the next tick writes again if this one still differs.
		if _, err := statuspatch.New(v1.WriterTenant, w.Client).Patch(ctx, d.Object, o); err != nil && !apierrors.IsConflict(err) {
			errs = append(errs, fmt.Sprintf("%s: %v", d.Object.Name, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// Status is what d's status should say, given its live leases and when
// a broker last served it.
func Status(d Declared, leases int64, seen time.Time) v1.TenantStatus {
	s := *d.Object.Status.DeepCopy()
	s.ObservedGeneration = d.Object.Generation
	s.Leases = int32(min(leases, 1<<31-1))
	if seen = seen.Truncate(time.Minute); !seen.IsZero() && (s.LastSeen == nil || s.LastSeen.Time.Before(seen)) {
		s.LastSeen = &metav1.Time{Time: seen}
	}
	ready := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonCredentialsRead,
		Message: "every credential Secret was read", ObservedGeneration: d.Object.Generation}
	switch {
	case len(d.Missing) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, v1.ReasonCredentialMissing
		ready.Message = "unread, so refused: " + strings.Join(d.Missing, "; ")
	case len(d.Unreadable) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, v1.ReasonCredentialUnreadable
		ready.Message = "its Secret cannot be read: " + strings.Join(d.Unreadable, "; ")
	}
	meta.SetStatusCondition(&s.Conditions, ready)
	return s
}
