// Package server runs the broker's listeners: LeaseService over gRPC, and
// the REST gateway, which dials that same gRPC endpoint so REST and gRPC
// share one chain of auth, tracing and metrics.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/egress-proxies/egress-proxies/pkg/auth"
	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/pkg/openapi"
)

// Options configure the listeners.
type Options struct {
	GRPCAddr string
	HTTPAddr string
	// MaxBodyBytes bounds REST request bodies.
	MaxBodyBytes int64
	// MaxRecvBytes bounds gRPC messages.
	MaxRecvBytes int
}

var requestDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "broker_request_duration_seconds",
	Help:    "LeaseService request latency by method and gRPC code (REST requests are counted once, at the gRPC server).",
	Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
}, []string{"method", "code"})

// Collectors are the server's metrics.
func Collectors() []prometheus.Collector { return []prometheus.Collector{requestDuration} }

func metricsInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := h(ctx, req)
	m := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	requestDuration.WithLabelValues(m, status.Code(err).String()).Observe(time.Since(start).Seconds())
	return resp, err
}

// Servers are the running listeners.
type Servers struct {
	GRPC     *grpc.Server
	HTTP     *http.Server
	grpcLn   net.Listener
	httpLn   net.Listener
	conn     *grpc.ClientConn
	Health   *health.Server
	GRPCAddr string
	HTTPAddr string
}

// New binds both listeners (a bad address fails at once) and wires svc.
func New(ctx context.Context, log *slog.Logger, o Options, svc leasev1.LeaseServiceServer, tok *auth.Token) (*Servers, error) {
	gln, err := net.Listen("tcp", o.GRPCAddr)
	if err != nil {
		return nil, fmt.Errorf("--grpc-addr %s: %w", o.GRPCAddr, err)
	}
	hln, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		_ = gln.Close()
		return nil, fmt.Errorf("--http-addr %s: %w", o.HTTPAddr, err)
	}
	gs := grpc.NewServer(
		grpc.StatsHandler(otelgrpc.NewServerHandler()),
		grpc.ChainUnaryInterceptor(metricsInterceptor, tok.UnaryInterceptor()),
		grpc.MaxRecvMsgSize(o.MaxRecvBytes),
	)
	leasev1.RegisterLeaseServiceServer(gs, svc)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(gs, hs)

	// The gateway is a client of our own gRPC listener.
	target := gln.Addr().String()
	conn, err := grpc.NewClient(target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(o.MaxRecvBytes)),
	)
	if err != nil {
		return nil, err
	}
	mux := runtime.NewServeMux(
		runtime.WithMarshalerOption(runtime.MIMEWildcard, &runtime.JSONPb{
			MarshalOptions:   protojson.MarshalOptions{EmitUnpopulated: true},
			UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: false},
		}),
		// The parser is process-global in grpc-gateway; the broker has one mux.
		runtime.SetQueryParameterParser(attributeQueryParser{}),
	)
	if err := leasev1.RegisterLeaseServiceHandler(ctx, mux, conn); err != nil {
		return nil, err
	}
	root := http.NewServeMux()
	root.HandleFunc("GET /openapi.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(openapi.LeaseJSON)
	})
	root.Handle("/", limitBody(o.MaxBodyBytes, noContentOnDelete(mux)))
	s := &Servers{
		GRPC: gs, Health: hs, conn: conn, grpcLn: gln, httpLn: hln,
		HTTP:     &http.Server{Handler: otelhttp.NewHandler(root, "rest"), ReadHeaderTimeout: 10 * time.Second},
		GRPCAddr: gln.Addr().String(), HTTPAddr: hln.Addr().String(),
	}
	log.Info("listening", "grpc", s.GRPCAddr, "rest", s.HTTPAddr)
	return s, nil
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
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = s.HTTP.Shutdown(sctx)
	s.GRPC.GracefulStop()
	_ = s.conn.Close()
	return nil
}

// limitBody turns an oversize body into the gateway's 400 with a message.
func limitBody(n int64, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, n)
		h.ServeHTTP(w, r)
	})
}

// noContentOnDelete answers a successful DELETE with 204 and no body, as
// the seed's clients expect of release.
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
// plain query parameters (?geo=eu), as the seed's API did: every parameter
// that is not a field of the request becomes a selector pair. Other
// requests reject unknown parameters.
type attributeQueryParser struct{}

var known = map[string]bool{"healthy": true, "namespace": true}

func (attributeQueryParser) Parse(msg proto.Message, values url.Values, filter *utilities.DoubleArray) error {
	list, isList := msg.(*leasev1.ListProxiesRequest)
	fields, extra := url.Values{}, url.Values{}
	for k, v := range values {
		if known[k] || strings.HasPrefix(k, "selector") || !isList {
			fields[k] = v
		} else {
			extra[k] = v
		}
	}
	if err := (&runtime.DefaultQueryParser{}).Parse(msg, fields, filter); err != nil {
		return err
	}
	if len(extra) > 0 && list.Selector == nil {
		list.Selector = map[string]string{}
	}
	for k, v := range extra {
		if len(v) != 1 {
			return fmt.Errorf("query parameter %q: give one value (attributes are matched exactly)", k)
		}
		list.Selector[k] = v[0]
	}
	return nil
}
