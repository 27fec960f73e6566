package leases

import (
	"context"

	"google.golang.org/grpc"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
)

// GRPC is s as the gRPC and REST transport serves it: each method takes
// its caller from the context the transport's interceptor verified
// (access.CallerOf) and calls s with it. The proxy gateway is the other
// transport: it builds its caller itself and calls s directly.
func GRPC(s *Service) leasev1.LeaseServiceServer { return grpcServer{s: s} }

type grpcServer struct {
	leasev1.UnimplementedLeaseServiceServer
	s *Service
}

func (g grpcServer) ListProxies(ctx context.Context, r *leasev1.ListProxiesRequest) (*leasev1.ListProxiesResponse, error) {
	return g.s.ListProxies(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) CreateLease(ctx context.Context, r *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	return g.s.CreateLease(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) RenewLease(ctx context.Context, r *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error) {
	return g.s.RenewLease(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ReleaseLease(ctx context.Context, r *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error) {
	return g.s.ReleaseLease(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ReportLease(ctx context.Context, r *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error) {
	return g.s.ReportLease(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ReportSession(ctx context.Context, r *leasev1.ReportSessionRequest) (*leasev1.ReportSessionResponse, error) {
	return g.s.ReportSession(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ListRefusals(ctx context.Context, r *leasev1.ListRefusalsRequest) (*leasev1.ListRefusalsResponse, error) {
	return g.s.ListRefusals(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ListLeases(ctx context.Context, r *leasev1.ListLeasesRequest) (*leasev1.ListLeasesResponse, error) {
	return g.s.ListLeases(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ExplainProxy(ctx context.Context, r *leasev1.ExplainProxyRequest) (*leasev1.ExplainProxyResponse, error) {
	return g.s.ExplainProxy(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) ExplainTarget(ctx context.Context, r *leasev1.ExplainTargetRequest) (*leasev1.ExplainTargetResponse, error) {
	return g.s.ExplainTarget(ctx, access.CallerOf(ctx), r)
}

func (g grpcServer) WatchProxies(r *leasev1.WatchProxiesRequest, stream grpc.ServerStreamingServer[leasev1.WatchProxiesResponse]) error {
	return g.s.WatchProxies(access.CallerOf(stream.Context()), r, stream)
}
