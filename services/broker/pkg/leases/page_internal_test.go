package leases

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
)

// A page holds MaxPageSize proxies when the request names no size or a
// larger one, and the given size otherwise; the last page has no token.
func TestPageSizes(t *testing.T) {
	inv := inventory.New(nil)
	matches := make([]inventory.Proxy, 1200)
	for i := range matches {
		matches[i] = inventory.Proxy{UID: fmt.Sprint("u", i), ID: fmt.Sprintf("ns/p%04d", i)}
	}
	// Added out of order: the inventory keeps them sorted.
	for i := range matches {
		inv.Set(matches[(i*7)%len(matches)])
	}
	for _, tc := range []struct {
		size  int32
		pages []int
	}{
		{0, []int{500, 500, 200}},
		{10_000, []int{500, 500, 200}},
		{1, nil}, // 1,200 pages of one, checked by count below
		{400, []int{400, 400, 400}},
		{1200, []int{500, 500, 200}},
	} {
		t.Run(fmt.Sprint(tc.size), func(t *testing.T) {
			req := &leasev1.ListProxiesRequest{PageSize: tc.size}
			var sizes []int
			seen := 0
			for {
				c, err := readCursor(req)
				require.NoError(t, err)
				ps, more := inv.Page(nil, nil, nil, c.after, c.size)
				next := c.next(ps, more)
				require.Equal(t, matches[seen].ID, ps[0].ID, "pages follow one another")
				seen += len(ps)
				sizes = append(sizes, len(ps))
				if next == "" {
					break
				}
				req.PageToken = next
			}
			assert.Equal(t, len(matches), seen)
			if tc.pages != nil {
				assert.Equal(t, tc.pages, sizes)
			} else {
				assert.Len(t, sizes, len(matches))
			}
		})
	}
}
