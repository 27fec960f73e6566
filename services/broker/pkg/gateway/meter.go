package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// meterStep is how many bytes a metered tunnel or request carries
// between two counts in the store: with both directions in flight, a
// tunnel passes its tenant's quota by less than three steps (under the
// 1 MiB the docs promise), at one store write per step.
const meterStep = 256 << 10

// errOverQuota ends a tunnel or request whose tenant's day passed its
// gatewayBytesPerDay while it flowed.
var errOverQuota = errors.New("the tenant's gatewayBytesPerDay is reached")

// byteMeter counts one tunnel's or plain request's bytes, both ways,
// against its tenant's day as they flow: whenever a step's worth is
// pending it goes to the store, whose day total says whether the quota
// is passed. Both directions of a tunnel add to one meter.
type byteMeter struct {
	g      *Gateway
	tenant string
	quota  int64

	mu      sync.Mutex
	pending int64
	over    bool
}

// byteMeter is t's meter, nil (counting nothing) when t has no byte
// quota or the gateway no store.
func (g *Gateway) byteMeter(t *access.Tenant) *byteMeter {
	if g.o.Meter == nil || t.Quotas.GatewayBytesPerDay <= 0 {
		return nil
	}
	return &byteMeter{g: g, tenant: t.Name, quota: t.Quotas.GatewayBytesPerDay}
}

// add counts n bytes, and says whether the tenant may carry more.
func (m *byteMeter) add(n int64) bool {
	if m == nil {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pending += n
	if m.pending >= meterStep && !m.over {
		m.flushLocked()
	}
	return !m.over
}

// flush counts what is pending: at the end of the tunnel or request.
func (m *byteMeter) flush() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flushLocked()
}

func (m *byteMeter) flushLocked() {
	if m.pending == 0 {
		return
	}
	// Bounded as withinBytes's read: the tunnel waits on it.
	ctx, cancel := context.WithTimeout(context.Background(), m.g.o.DialTimeout)
	defer cancel()
	n := m.pending
	m.pending = 0
	total, err := m.g.o.Meter.AddTenantBytes(ctx, m.tenant, n, m.g.o.Clock.Now())
	if err != nil {
		// A store that cannot count lets the bytes through, as
		// withinBytes does (leasing says why the store is away), and
		// they are not tried again with every step while it is away.
		m.g.log.Warn("gateway could not count bytes against their tenant's day", "tenant", m.tenant, "bytes", n, "err", err)
		return
	}
	if total >= m.quota {
		m.over = true
	}
}

// metered is a connection whose writes a byteMeter counts: a plain
// request's, to the site and back to the client. A write past the quota
// fails, which ends the request.
type metered struct {
	net.Conn
	bytes *byteMeter
}

func (c metered) Write(p []byte) (int, error) {
	if c.bytes == nil {
		return c.Conn.Write(p)
	}
	// Written in steps, so one large write is counted as it goes.
	var n int
	for len(p) > 0 {
		k, err := c.Conn.Write(p[:min(len(p), meterStep)])
		n += k
		p = p[k:]
		if !c.bytes.add(int64(k)) {
			return n, fmt.Errorf("%w: the gateway ended the request", errOverQuota)
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
