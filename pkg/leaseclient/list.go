package leaseclient

import (
	"context"
	"iter"

	"google.golang.org/protobuf/proto"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

// AllProxies walks every page of ListProxies under req's filters (and
// page size), yielding each proxy in id order, or the error that ended
// the walk as its last pair. A proxy that exists throughout the walk is
// yielded exactly once, however the fleet changes meanwhile.
//
//	for p, err := range leaseclient.AllProxies(ctx, c.API(), &leasev1.ListProxiesRequest{Namespace: "crawl"}) {
func AllProxies(ctx context.Context, api leasev1.LeaseServiceClient, req *leasev1.ListProxiesRequest) iter.Seq2[*leasev1.Proxy, error] {
	return func(yield func(*leasev1.Proxy, error) bool) {
		r := proto.CloneOf(req)
		for {
			resp, err := api.ListProxies(ctx, r)
			if err != nil {
				yield(nil, err)
				return
			}
			for _, p := range resp.GetProxies() {
				if !yield(p, nil) {
					return
				}
			}
			if resp.GetNextPageToken() == "" {
				return
			}
			r.PageToken = resp.GetNextPageToken()
		}
	}
}
