package proxysource

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// meterEvery is how often a metered source counts its probes' bytes.
const meterEvery = time.Minute

// probeBytesGuess is what one probe is taken to cost until probes have
// been counted: a CONNECT, a TLS handshake and a small answer.
const probeBytesGuess = 8 << 10

// maxInterval is the longest probe interval a Proxy's spec takes.
const maxInterval = 3600

// spent is a metered source's count as last read from the Meter.
type spent struct {
	uid           types.UID
	bytes, probes int64
}

// meter counts what the members' probes spent today into
// status.probe, and returns the probe interval (seconds) that spreads
// what is left of the day's budget over the rest of the day: 0 for a
// source without a budget.
func (r *Reconciler) meter(src *v1.ProxySource, proxies map[string]*v1.Proxy, now time.Time) int32 {
	b := src.Spec.ProbeBudget
	if b == nil || r.opts.Meter == nil {
		src.Status.Probe = nil
		return 0
	}
	ids := make([]types.NamespacedName, 0, len(proxies))
	for _, px := range proxies {
		ids = append(ids, client.ObjectKeyFromObject(px))
	}
	bytes, probes := r.opts.Meter.ProbeBytes(ids)
	key := client.ObjectKeyFromObject(src)
	r.mu.Lock()
	last, ok := r.spent[key]
	r.spent[key] = spent{uid: src.UID, bytes: bytes, probes: probes}
	r.mu.Unlock()
	delta := int64(0)
	if ok && last.uid == src.UID && bytes >= last.bytes {
		delta = bytes - last.bytes
	}
	day := now.UTC().Format(time.DateOnly)
	spend := v1.ProbeSpend{Day: day}
	if st := src.Status.Probe; st != nil && st.Day == day {
		spend = *st
	}
	spend.SpentBytes += delta
	perProbe := int64(probeBytesGuess)
	if probes > 0 {
		perProbe = max(bytes/probes, 1)
	}
	left := b.BytesPerDay - spend.SpentBytes
	midnight := now.UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	interval := int64(maxInterval)
	if left > 0 {
		// Each member probes once per interval until midnight.
		interval = int64(len(proxies)) * perProbe * int64(midnight.Sub(now).Seconds()) / left
	}
	spend.IntervalSeconds = int32(min(max(interval, 1), maxInterval))
	src.Status.Probe = &spend
	return spend.IntervalSeconds
}
