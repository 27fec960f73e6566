package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
)

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
