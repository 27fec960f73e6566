package server

import (
	"context"
	"net/url"
	"testing"

	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

func TestChainRunsInterceptorsInOrder(t *testing.T) {
	var trail []string
	mark := func(name string) grpc.UnaryServerInterceptor {
		return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			trail = append(trail, name+">"+info.FullMethod)
			resp, err := h(ctx, req)
			trail = append(trail, "<"+name)
			return resp, err
		}
	}
	svc := rest{ic: chain(mark("a"), mark("b")), svc: handler{trail: &trail}}
	resp, err := svc.ReleaseLease(context.Background(), &leasev1.ReleaseLeaseRequest{LeaseId: "x"})
	require.NoError(t, err)
	assert.NotNil(t, resp)
	m := leasev1.LeaseService_ReleaseLease_FullMethodName
	assert.Equal(t, []string{"a>" + m, "b>" + m, "handler", "<b", "<a"}, trail)
}

type handler struct {
	leasev1.UnimplementedLeaseServiceServer
	trail *[]string
}

func (h handler) ReleaseLease(context.Context, *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error) {
	*h.trail = append(*h.trail, "handler")
	return &leasev1.ReleaseLeaseResponse{}, nil
}

func TestAttributeQueryParameters(t *testing.T) {
	for _, tc := range []struct {
		query   string
		want    map[string]string
		healthy *bool
		err     string
	}{
		{query: "geo=eu&tier=a", want: map[string]string{"geo": "eu", "tier": "a"}},
		{query: "healthy=true&geo=eu", want: map[string]string{"geo": "eu"}, healthy: new(true)},
		{query: "selector[geo]=eu", want: map[string]string{"geo": "eu"}},
		{query: "geo=eu&geo=us", err: `query parameter "geo": give one value`},
	} {
		t.Run(tc.query, func(t *testing.T) {
			v, err := url.ParseQuery(tc.query)
			require.NoError(t, err)
			req := &leasev1.ListProxiesRequest{}
			err = attributeQueryParser{}.Parse(req, v, utilities.NewDoubleArray(nil))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, req.GetSelector())
			if tc.healthy != nil {
				assert.Equal(t, *tc.healthy, req.GetHealthy())
			}
		})
	}
	// Other requests do not take attributes from the query.
	create := &leasev1.CreateLeaseRequest{}
	require.NoError(t, attributeQueryParser{}.Parse(create, url.Values{"geo": {"eu"}}, utilities.NewDoubleArray(nil)))
	assert.Empty(t, create.GetSelector())
}

// Every method of the service reaches the interceptor chain through
// rest: one left out would be answered UNIMPLEMENTED by the embedded
// server, as GET /v1/refusals once was.
func TestEveryMethodGoesThroughTheChain(t *testing.T) {
	for _, m := range leasev1.LeaseService_ServiceDesc.Methods {
		t.Run(m.MethodName, func(t *testing.T) {
			var seen string
			ic := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				seen = info.FullMethod
				return h(ctx, req)
			}
			p := rest{svc: leasev1.UnimplementedLeaseServiceServer{}, ic: ic}
			_, _ = m.Handler(p, context.Background(), func(any) error { return nil }, nil)
			assert.Equal(t, "/"+leasev1.LeaseService_ServiceDesc.ServiceName+"/"+m.MethodName, seen)
		})
	}
}
