package leases_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// A walk over ListProxies' pages lists, in id order, every proxy that
// exists throughout it exactly once, while proxies are deleted and
// created on both sides of where it stands; a token answers only the
// filters it was given for.
func TestListProxiesPagesAreStableUnderChange(t *testing.T) {
	s, svc := newService(t)
	ctx := context.Background()
	made := map[string]string{} // name: UID
	for i := range 7 {
		made[fmt.Sprintf("p%d", i)] = s.Proxy(t, fmt.Sprintf("p%d", i), fmt.Sprintf("127.0.0.%d", 20+i), nil).UID
	}
	id := func(name string) string { return s.NS + "/" + name }
	ids := func(ps []*leasev1.Proxy) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.GetId())
		}
		return out
	}

	first, err := svc.ListProxies(ctx, access.Anonymous, &leasev1.ListProxiesRequest{PageSize: 3})
	require.NoError(t, err)
	require.Equal(t, []string{id("p0"), id("p1"), id("p2")}, ids(first.GetProxies()))
	require.NotEmpty(t, first.GetNextPageToken())

	// Behind the cursor: p1 goes, p00 comes. Ahead of it: p4 goes, p25
	// comes.
	for _, name := range []string{"p1", "p4"} {
		require.NoError(t, env.Client.Delete(ctx, &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: s.NS, Name: name}}))
		require.Eventually(t, func() bool { _, ok := s.Inv.Get(made[name]); return !ok }, 10*time.Second, 10*time.Millisecond)
	}
	s.Proxy(t, "p00", "127.0.0.40", nil)
	s.Proxy(t, "p25", "127.0.0.41", nil)

	var rest []string
	req := &leasev1.ListProxiesRequest{PageSize: 3, PageToken: first.GetNextPageToken()}
	for pages := 0; req.PageToken != ""; pages++ {
		require.Less(t, pages, 5, "the walk ends")
		resp, err := svc.ListProxies(ctx, access.Anonymous, req)
		require.NoError(t, err)
		rest = append(rest, ids(resp.GetProxies())...)
		req.PageToken = resp.GetNextPageToken()
	}
	assert.Equal(t, []string{id("p25"), id("p3"), id("p5"), id("p6")}, rest,
		"each proxy that was there throughout exactly once, in order; p25 came in ahead of the cursor, p00 behind it")

	for _, tc := range []struct {
		name  string
		req   *leasev1.ListProxiesRequest
		field string
	}{
		{"negative size", &leasev1.ListProxiesRequest{PageSize: -1}, "page_size"},
		{"a token not given by this API", &leasev1.ListProxiesRequest{PageToken: "bm90LWEtdG9rZW4"}, "page_token"},
		{"a token for other filters", &leasev1.ListProxiesRequest{PageToken: first.GetNextPageToken(), Namespace: s.NS}, "page_token"},
		{"a token for another health filter", &leasev1.ListProxiesRequest{PageToken: first.GetNextPageToken(), Healthy: new(true)}, "page_token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := svc.ListProxies(ctx, access.Anonymous, tc.req)
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), tc.field)
		})
	}
}
