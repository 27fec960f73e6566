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
	"math"
	"net"
	"net/http"
	"net/url"
	"path"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

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

// rest is LeaseService as grpc-gateway's in-process handlers call it:
// they skip gRPC's interceptors, so each call goes through the chain here,
// then to the service. The embedded Unimplemented server would answer a
// method left out here, so TestEveryMethodGoesThroughTheChain holds it to
// the service descriptor.
type rest struct {
	leasev1.UnimplementedLeaseServiceServer
	svc leasev1.LeaseServiceServer
	ic  grpc.UnaryServerInterceptor
	sic grpc.StreamServerInterceptor
}

func invoke[Req, Resp any](ctx context.Context, p rest, method string, req Req, h func(context.Context, Req) (Resp, error)) (Resp, error) {
	resp, err := p.ic(ctx, req, &grpc.UnaryServerInfo{Server: p.svc, FullMethod: method}, func(ctx context.Context, r any) (any, error) {
		return h(ctx, r.(Req))
	})
	if err != nil {
		var zero Resp
		return zero, err
	}
	return resp.(Resp), nil
}

func (p rest) ListProxies(ctx context.Context, r *leasev1.ListProxiesRequest) (*leasev1.ListProxiesResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ListProxies_FullMethodName, r, p.svc.ListProxies)
}

func (p rest) CreateLease(ctx context.Context, r *leasev1.CreateLeaseRequest) (*leasev1.CreateLeaseResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_CreateLease_FullMethodName, r, p.svc.CreateLease)
}

func (p rest) RenewLease(ctx context.Context, r *leasev1.RenewLeaseRequest) (*leasev1.RenewLeaseResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_RenewLease_FullMethodName, r, p.svc.RenewLease)
}

func (p rest) ReleaseLease(ctx context.Context, r *leasev1.ReleaseLeaseRequest) (*leasev1.ReleaseLeaseResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ReleaseLease_FullMethodName, r, p.svc.ReleaseLease)
}

func (p rest) ReportLease(ctx context.Context, r *leasev1.ReportLeaseRequest) (*leasev1.ReportLeaseResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ReportLease_FullMethodName, r, p.svc.ReportLease)
}

func (p rest) ReportSession(ctx context.Context, r *leasev1.ReportSessionRequest) (*leasev1.ReportSessionResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ReportSession_FullMethodName, r, p.svc.ReportSession)
}

func (p rest) ListRefusals(ctx context.Context, r *leasev1.ListRefusalsRequest) (*leasev1.ListRefusalsResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ListRefusals_FullMethodName, r, p.svc.ListRefusals)
}

func (p rest) ListLeases(ctx context.Context, r *leasev1.ListLeasesRequest) (*leasev1.ListLeasesResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ListLeases_FullMethodName, r, p.svc.ListLeases)
}

func (p rest) ExplainProxy(ctx context.Context, r *leasev1.ExplainProxyRequest) (*leasev1.ExplainProxyResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ExplainProxy_FullMethodName, r, p.svc.ExplainProxy)
}

func (p rest) ExplainTarget(ctx context.Context, r *leasev1.ExplainTargetRequest) (*leasev1.ExplainTargetResponse, error) {
	return invoke(ctx, p, leasev1.LeaseService_ExplainTarget_FullMethodName, r, p.svc.ExplainTarget)
}

func (p rest) WatchProxies(r *leasev1.WatchProxiesRequest, stream grpc.ServerStreamingServer[leasev1.WatchProxiesResponse]) error {
	info := &grpc.StreamServerInfo{FullMethod: leasev1.LeaseService_WatchProxies_FullMethodName, IsServerStream: true}
	return p.sic(p.svc, stream, info, func(_ any, ss grpc.ServerStream) error {
		return p.svc.WatchProxies(r, &grpc.GenericServerStream[leasev1.WatchProxiesRequest, leasev1.WatchProxiesResponse]{ServerStream: ss})
	})
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

// retryAfterHeader is the gateway's error answer plus, when the status
// carries a RetryInfo (a refused lease), the Retry-After header HTTP
// clients and their retry libraries read, in whole seconds rounded up.
func retryAfterHeader(ctx context.Context, mux *runtime.ServeMux, m runtime.Marshaler, w http.ResponseWriter, r *http.Request, err error) {
	if st, ok := status.FromError(err); ok {
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				secs := int64(math.Ceil(ri.GetRetryDelay().AsDuration().Seconds()))
				w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
			}
		}
	}
	runtime.DefaultHTTPErrorHandler(ctx, mux, m, w, r, err)
}

// limitBody turns an oversize body into the gateway's 400 with a message.
func limitBody(n int64, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, n)
		h.ServeHTTP(w, r)
	})
}

// noContentOnDelete answers a successful DELETE with 204 and no body, as
// the v1 REST API documents release (docs/api/lease-api.md).
func noContentOnDelete(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(&noContentWriter{ResponseWriter: w}, r)
	})
}

type noContentWriter struct {
	http.ResponseWriter
	status  int
	ok      bool
	written bool
}

func (w *noContentWriter) WriteHeader(code int) {
	if w.written {
		return
	}
	w.written = true
	if code == http.StatusOK {
		w.ok = true
		w.ResponseWriter.Header().Del("Content-Type")
		w.ResponseWriter.WriteHeader(http.StatusNoContent)
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *noContentWriter) Write(b []byte) (int, error) {
	if !w.written {
		w.WriteHeader(http.StatusOK)
	}
	if w.ok {
		return len(b), nil
	}
	return w.ResponseWriter.Write(b)
}

// attributeQueryParser lets GET /v1/proxies take attribute filters as
// plain query parameters (?geo=eu), as docs/api/lease-api.md documents: every parameter
// that is not a field of the request becomes a selector pair. Other
// requests parse as the gateway's default parser does.
type attributeQueryParser struct{}

var known = map[string]bool{"healthy": true, "namespace": true, "target": true,
	"page_size": true, "pageSize": true, "page_token": true, "pageToken": true}

func (attributeQueryParser) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	var selector *map[string]string
	switch m := msg.(type) {
	case *leasev1.ListProxiesRequest:
		selector = &m.Selector
	case *leasev1.WatchProxiesRequest:
		selector = &m.Selector
	}
	fields, extra := url.Values{}, url.Values{}
	for k, v := range values {
		if known[k] || strings.HasPrefix(k, "selector") || selector == nil {
			fields[k] = v
		} else {
			extra[k] = v
		}
	}
	if err := (&runtime.DefaultQueryParser{}).Parse(msg, fields, filter); err != nil {
		return err
	}
	if len(extra) > 0 && *selector == nil {
		*selector = map[string]string{}
	}
	for k, v := range extra {
		if len(v) != 1 {
			return fmt.Errorf("query parameter %q: give one value (attributes are matched exactly)", k)
		}
		(*selector)[k] = v[0]
	}
	return nil
}
