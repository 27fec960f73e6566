package leases

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/index"
)

// Bounds of ListRefusals' window.
const (
	defaultRefusalWindow = time.Minute
	maxRefusalWindow     = 10 * time.Minute
)

// ListRefusals serves LeaseService.ListRefusals for c.
func (s *Service) ListRefusals(ctx context.Context, c access.Caller, req *leasev1.ListRefusalsRequest) (*leasev1.ListRefusalsResponse, error) {
	window := time.Duration(req.GetWindowSeconds()) * time.Second
	switch {
	case window == 0:
		window = defaultRefusalWindow
	case window < time.Second || window > maxRefusalWindow:
		return nil, invalid("windowSeconds", "must be between 1 and %d (got %d)", int(maxRefusalWindow.Seconds()), req.GetWindowSeconds())
	}
	t := c.Tenant
	counts, err := s.store.Refusals(ctx, window, s.cfg.Clock.Now())
	if err != nil {
		return nil, storeError(err)
	}
	resp := &leasev1.ListRefusalsResponse{}
	for def, n := range counts {
		var sel index.Selector
		if err := json.Unmarshal([]byte(def), &sel); err != nil {
			continue // not an index this broker version wrote
		}
		if !t.SeesAll(sel.Namespaces) {
			continue // another tenant's demand is not this one's to see
		}
		resp.Selectors = append(resp.Selectors, &leasev1.SelectorRefusals{Namespace: strings.Join(sel.Namespaces, ","), Selector: sel.Labels, Refused: n})
	}
	sort.Slice(resp.Selectors, func(i, j int) bool {
		a, b := resp.Selectors[i], resp.Selectors[j]
		if a.Refused != b.Refused {
			return a.Refused > b.Refused
		}
		return fmt.Sprint(a.Namespace, a.Selector) < fmt.Sprint(b.Namespace, b.Selector)
	})
	return resp, nil
}
