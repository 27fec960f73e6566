package proxypool

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/leaseview"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/memberset"
)

// Defaults of the pool's optional fields, as the CRD also declares them.
var (
	defaultMaxSurge       = intstr.FromInt32(1)
	defaultMaxUnavailable = intstr.FromInt32(0)
	defaultDisruption     = intstr.FromString("10%")
	defaultMaxUnhealthy   = intstr.FromString("40%")
)

const (
	defaultDrainTimeout     = 10 * time.Minute
	defaultUnhealthyTimeout = 10 * time.Minute
	defaultMaxRetries       = 5
	defaultRetryBackoff     = 30 * time.Second
	maxRetryBackoff         = time.Hour
)

func durationOr(d *metav1.Duration, def time.Duration) time.Duration {
	if d != nil {
		return d.Duration
	}
	return def
}

// resolve turns the pool's spec into counts. Percentages of surge and the
// disruption budget round up and maxUnavailable down, as a Deployment's
// do; when both rollout bounds come to 0 maxUnavailable becomes 1, so a
// rollout can always move.
func resolve(pool *v1.ProxyPool, markLag time.Duration) (limits, error) {
	l := limits{replicas: pool.DesiredReplicas(), markLag: markLag, drainTimeout: defaultDrainTimeout}
	surge, unavailable, budget := &defaultMaxSurge, &defaultMaxUnavailable, &defaultDisruption
	if s := pool.Spec.Strategy; s != nil {
		surge = cmpOr(s.MaxSurge, surge)
		unavailable = cmpOr(s.MaxUnavailable, unavailable)
	}
	if d := pool.Spec.Disruption; d != nil {
		budget = cmpOr(d.MaxUnavailable, budget)
	}
	var err error
	var errs []error
	l.surge, err = intstr.GetScaledValueFromIntOrPercent(surge, l.replicas, true)
	errs = append(errs, field("spec.strategy.maxSurge", err))
	l.unavailable, err = intstr.GetScaledValueFromIntOrPercent(unavailable, l.replicas, false)
	errs = append(errs, field("spec.strategy.maxUnavailable", err))
	l.budget, err = intstr.GetScaledValueFromIntOrPercent(budget, l.replicas, true)
	errs = append(errs, field("spec.disruption.maxUnavailable", err))
	if l.surge == 0 && l.unavailable == 0 {
		l.unavailable = 1
	}
	l.budget = max(l.budget, 1)
	l.drainTimeout = durationOr(pool.Spec.DrainTimeout, defaultDrainTimeout)

	rem := pool.Spec.Remediation
	if rem == nil {
		rem = &v1.Remediation{}
	}
	l.startupTimeout = pool.StartupTimeout()
	l.unhealthyTimeout = durationOr(rem.UnhealthyTimeout, defaultUnhealthyTimeout)
	l.backoffBase, l.backoffMax = durationOr(rem.RetryBackoff, defaultRetryBackoff), maxRetryBackoff
	l.maxRetries = defaultMaxRetries
	if rem.MaxRetries != nil {
		l.maxRetries = int(*rem.MaxRetries)
	}
	l.maxUnhealthy, err = intstr.GetScaledValueFromIntOrPercent(cmpOr(rem.MaxUnhealthy, &defaultMaxUnhealthy), l.replicas, true)
	errs = append(errs, field("spec.remediation.maxUnhealthy", err))
	l.distinctEgressIPs = pool.Spec.DistinctEgressIPs
	if pool.Spec.RolloutAfter != nil {
		l.rolloutAfter = pool.Spec.RolloutAfter.Time
	}
	return l, errors.Join(errs...)
}

func cmpOr(v, d *intstr.IntOrString) *intstr.IntOrString {
	if v != nil {
		return v
	}
	return d
}

func field(name string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// templateHash hashes what makes an instance: a member whose hash differs
// from its pool's is replaced. Attributes and health checks are not in
// it; they change in place.
func templateHash(t *v1.ProxyTemplateSpec) string {
	b, _ := json.Marshal(struct {
		Provider  string
		Placement *v1.Placement
		CloudInit *v1.CloudInit
		Port      int32
	}{t.Provider, t.Placement, t.CloudInit, t.Port})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:10]
}

// observed is a pool's members as the cache holds them.
type observed struct {
	members []*member
	proxies map[string]*v1.Proxy // by name
	// taken holds every Proxy name in the namespace, members or not.
	taken map[string]bool
}

// observe reads the pool's members from the cache, with the live-lease
// counts of snap: the one view a reconcile decides on.
func observe(ctx context.Context, c client.Reader, pool *v1.ProxyPool, hash string, snap leaseview.Snapshot) (*observed, error) {
	proxies, taken, err := memberset.Members(ctx, c, pool)
	if err != nil {
		return nil, err
	}
	o := &observed{proxies: proxies, taken: taken}
	for _, px := range proxies {
		m := &member{
			name: px.Name, created: px.CreationTimestamp.Time,
			updated:      px.Labels[v1.LabelTemplateHash] == hash,
			ready:        meta.IsStatusConditionTrue(px.Status.Conditions, v1.ConditionReady),
			deleting:     !px.DeletionTimestamp.IsZero(),
			leases:       snap.Leases[px.Key()],
			doNotDisrupt: px.Annotations[v1.AnnotationDoNotDisrupt] == "true",
		}
		m.healthy = m.ready && px.Status.IsHealthy()
		m.since = since(px)
		if m.ready {
			m.egressIP = px.Status.EgressIP
		}
		m.replaces = px.Annotations[v1.AnnotationReplaces]
		m.retries, _ = strconv.Atoi(px.Annotations[v1.AnnotationSlotRetries])
		if pool.Spec.MaxAge != nil {
			m.ageLimit = jittered(pool.Spec.MaxAge.Duration, px.UID)
		}
		m.deadline, _ = px.DrainDeadline()
		o.members = append(o.members, m)
	}
	// In name order, as the list gave them: the planner sees one order.
	slices.SortFunc(o.members, func(a, b *member) int { return strings.Compare(a.name, b.name) })
	return o, nil
}

// since is when a healthy member became healthy, or when an unhealthy
// Ready one stopped being healthy: the later of its Ready and Healthy
// conditions' transitions.
func since(px *v1.Proxy) time.Time {
	var t time.Time
	for _, c := range []string{v1.ConditionReady, v1.ConditionHealthy} {
		if cond := meta.FindStatusCondition(px.Status.Conditions, c); cond != nil && cond.LastTransitionTime.After(t) {
			t = cond.LastTransitionTime.Time
		}
	}
	if t.IsZero() {
		t = px.CreationTimestamp.Time
	}
	return t
}

// jittered is maxAge less up to a tenth of it, the fraction fixed by the
// member's UID: members made together rotate spread over that tenth,
// and every controller computes the same limit.
func jittered(maxAge time.Duration, uid types.UID) time.Duration {
	sum := sha256.Sum256([]byte(uid))
	frac := float64(binary.BigEndian.Uint64(sum[:8])) / float64(math.MaxUint64)
	return maxAge - time.Duration(frac*float64(maxAge)/10)
}
