// Package server runs the broker's API listeners: LeaseService over gRPC,
// and over REST through grpc-gateway, which calls the service in process
// through the same interceptor chain (auth, metrics) as the gRPC server,
// so REST and gRPC are checked and counted alike without a loopback gRPC
// hop per call. The proxy gateway is a transport of its own (package
// gateway): it calls the lease service directly.
package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path"
	goruntime "runtime"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/openapi"
	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/access"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/console"
)

// Options configure the listeners.
type Options struct {
	GRPCAddr string
	HTTPAddr string
	// MaxBodyBytes bounds REST request bodies.
	MaxBodyBytes int64
	// MaxRecvBytes bounds gRPC messages.
	MaxRecvBytes int
	// Tracing adds OpenTelemetry spans to gRPC and REST calls; without an
	// exporter they would cost a twentieth of a lease's CPU for nothing.
	Tracing bool
	// TLS, when set, serves both ports over TLS only.
	TLS *tls.Config
	// Limits bound what one client may hold of either port.
	Limits service.Limits
	// Console serves the web console under console.Path.
	Console bool
}

// grpcMetrics counts REST calls as well as gRPC ones: the gateway calls
// the service through the same interceptor chain, so a REST lease is a
// grpc_server_handled_total{grpc_method="CreateLease"} like any other.
var grpcMetrics = service.NewGRPCMetrics()

// Collectors are the server's metrics.
func Collectors() []prometheus.Collector { return []prometheus.Collector{grpcMetrics} }

// countByCaller counts each call under its caller, as every transport
// does (access.Called).
func countByCaller(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	access.Called(access.CallerOf(ctx), path.Base(info.FullMethod), err)
	return resp, err
}

// chain runs interceptors in order around a handler, as
// grpc.ChainUnaryInterceptor does, as one interceptor both the gRPC
// server and the in-process gateway use.
func chain(ics ...grpc.UnaryServerInterceptor) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		next := h
		for i := len(ics) - 1; i >= 0; i-- {
			ic, inner := ics[i], next
			next = func(ctx context.Context, req any) (any, error) { return ic(ctx, req, info, inner) }
		}
		return next(ctx, req)
	}
}

// chainStream is chain for streams.
func chainStream(ics ...grpc.StreamServerInterceptor) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		next := h
		for i := len(ics) - 1; i >= 0; i-- {
			ic, inner := ics[i], next
			next = func(srv any, ss grpc.ServerStream) error { return ic(srv, ss, info, inner) }
		}
		return next(srv, ss)
	}
}

// Servers are the running listeners.
type Servers struct {
	GRPC     *grpc.Server
	HTTP     *http.Server
	grpcLn   net.Listener
	httpLn   net.Listener
	Health   *health.Server
	GRPCAddr string
	HTTPAddr string
}

// New binds both listeners (a bad address fails at once) and wires svc.
func New(ctx context.Context, log *slog.Logger, o Options, svc leasev1.LeaseServiceServer, v auth.Verifier) (*Servers, error) {
	gln, err := net.Listen("tcp", o.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("--grpc-addr %s: %w", o.GRPCAddr, err)
	}
	hln, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		_ = gln.Close()
		return nil, fmt.Errorf("--http-addr %s: %w", o.HTTPAddr, err)
	}
	ic := chain(grpcMetrics.UnaryServerInterceptor(), auth.UnaryInterceptor(v), countByCaller)
	sic := chainStream(grpcMetrics.StreamServerInterceptor(), auth.StreamInterceptor(v))
	opts := []grpc.ServerOption{
		// Calls run on reused goroutines whose stacks have already grown,
		// rather than a new goroutine per call growing its stack through the
		// interceptors, the store and go-redis: a tenth of a lease's CPU.
		// Past that many concurrent calls, gRPC starts goroutines as usual.
		grpc.NumStreamWorkers(uint32(16 * goruntime.GOMAXPROCS(0))),
		grpc.UnaryInterceptor(ic),
		grpc.StreamInterceptor(sic),
		grpc.MaxRecvMsgSize(o.MaxRecvBytes),
	}
	opts = append(opts, o.Limits.GRPCOptions()...)
	if o.Tracing {
		opts = append(opts, grpc.StatsHandler(otelgrpc.NewServerHandler()))
	}
	if o.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(o.TLS)))
		hln = tls.NewListener(hln, o.TLS)
	}
	gs := grpc.NewServer(opts...)
	leasev1.RegisterLeaseServiceServer(gs, svc)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)
	// grpcurl and grpcui discover the API without the .proto files; it
	// describes only what is public in proto/ anyway.
	reflection.Register(gs)

	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		// The parser is process-global in grpc-gateway; the broker has one mux.
		runtime.SetQueryParameterParser(attributeQueryParser{}),
		runtime.WithErrorHandler(retryAfterHeader),
	)
	in := rest{svc: svc, ic: ic, sic: sic}
	if err := leasev1.RegisterLeaseServiceHandlerServer(ctx, mux, in); err != nil {
		return nil, err
	}
	root := http.NewServeMux()
	root.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.LeaseJSON)
	})
	// grpc-gateway's in-process handlers do not stream: the watch has its
	// own, through the same chain.
	root.Handle("GET /v1/proxies:watch", watchREST(mux, in, o.Limits.WriteTimeout))
	root.Handle("/", limitBody(o.MaxBodyBytes, noContentOnDelete(mux)))
	if o.Console {
		root.Handle("GET "+console.Path, console.Handler())
		root.Handle("GET /console", http.RedirectHandler(console.Path, http.StatusMovedPermanently))
	}
	var rest http.Handler = root
	if o.Tracing {
		rest = otelhttp.NewHandler(root, "rest")
	}
	s := &Servers{
		GRPC: gs, Health: hs, grpcLn: gln, httpLn: hln,
		HTTP:     o.Limits.HTTPServer(rest),
		GRPCAddr: gln.Addr().String(), HTTPAddr: hln.Addr().String(),
	}
	log.Info("listening", "grpc", s.GRPCAddr, "rest", s.HTTPAddr)
	return s, nil
}

// FollowHealth sets the gRPC health service's status, overall and for
// LeaseService, from check every interval until ctx ends: NOT_SERVING
// while check fails (Redis unreachable), so a gRPC load balancer or a
// grpc-health-probe moves callers to a broker that can lease.
func (s *Servers) FollowHealth(ctx context.Context, interval time.Duration, check func(context.Context) error) {
	set := func(st healthpb.HealthCheckResponse_ServingStatus) {
		s.Health.SetServingStatus("", st)
		s.Health.SetServingStatus(leasev1.LeaseService_ServiceDesc.ServiceName, st)
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			cctx, cancel := context.WithTimeout(ctx, interval)
			err := check(cctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				set(healthpb.HealthCheckResponse_NOT_SERVING)
			} else {
				set(healthpb.HealthCheckResponse_SERVING)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Serve runs both servers until ctx ends, then stops them gracefully.
func (s *Servers) Serve(ctx context.Context) error {
	errc := make(chan error, 2)
	go func() { errc <- s.GRPC.Serve(s.grpcLn) }()
	go func() {
		if err := s.HTTP.Serve(s.httpLn); err != nil && err != http.ErrServerClosed {
			errc <- err
			return
		}
		errc <- nil
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.Health.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.HTTP.Shutdown(sctx)
	s.GRPC.GracefulStop()
	return nil
}
