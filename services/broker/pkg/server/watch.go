package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/grpc-ecosystem/grpc-gateway/v2/utilities"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/leases"
)

// watchREST serves GET /v1/proxies:watch: WatchProxies as newline-
// delimited JSON, one {"result": <WatchProxiesResponse>} a line, as
// grpc-gateway streams. An error before the first line is the API's usual
// error answer; one after it ends the stream with an {"error": <Status>}
// line. Each line must be written within writeTimeout (the REST port's
// write timeout, which would otherwise end every watch at its age), so a
// client that stops reading is cut, not waited on.
func watchREST(mux *runtime.ServeMux, in rest, writeTimeout time.Duration) http.Handler {
	m := &runtime.JSONPb{MarshalOptions: protojson.MarshalOptions{EmitUnpopulated: true}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := &leasev1.WatchProxiesRequest{}
		if err := (attributeQueryParser{}).Parse(req, r.URL.Query(), &utilities.DoubleArray{}); err != nil {
			retryAfterHeader(r.Context(), mux, m, w, r, status.Error(codes.InvalidArgument, err.Error()))
			return
		}
		// What the gateway does for the other calls: the token reaches the
		// interceptors as gRPC metadata.
		ctx := metadata.NewIncomingContext(r.Context(), metadata.Pairs("authorization", r.Header.Get("Authorization")))
		// The request was read: the port's read timeout must not go on
		// to cancel the watch (net/http cancels a request's context when
		// its connection's read deadline passes; golang/go#70834).
		st := &restStream{w: w, rc: http.NewResponseController(w), m: m, timeout: writeTimeout}
		st.ctx = leases.WithAborter(ctx, st)
		_ = st.rc.SetReadDeadline(time.Time{})
		err := in.WatchProxies(req, st)
		switch {
		case err == nil, st.isAborted():
			// A client cut for not reading is sent nothing more.
		case !st.started:
			retryAfterHeader(ctx, mux, m, w, r, err)
		default:
			_ = st.line("error", status.Convert(err).Proto())
		}
	})
}

// restStream is a WatchProxies stream written to an HTTP answer.
type restStream struct {
	ctx     context.Context
	w       http.ResponseWriter
	rc      *http.ResponseController
	m       runtime.Marshaler
	timeout time.Duration
	started bool

	// mu orders Abort against a line's deadline: once aborted, no line
	// moves the deadline forward again.
	mu      sync.Mutex
	aborted bool
}

// Abort implements leases.Aborter: a line blocked on a client that does
// not read fails now, and no line is written after it.
func (s *restStream) Abort() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aborted = true
	_ = s.rc.SetWriteDeadline(time.Now())
}

func (s *restStream) isAborted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aborted
}

func (s *restStream) Send(r *leasev1.WatchProxiesResponse) error { return s.line("result", r) }

func (s *restStream) line(key string, msg proto.Message) error {
	b, err := s.m.Marshal(msg)
	if err != nil {
		return err
	}
	if !s.started {
		s.w.Header().Set("Content-Type", "application/x-ndjson")
		s.w.WriteHeader(http.StatusOK)
		s.started = true
	}
	s.mu.Lock()
	if s.aborted {
		s.mu.Unlock()
		return errAborted
	}
	_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	s.mu.Unlock()
	if _, err := fmt.Fprintf(s.w, "{%q:%s}\n", key, b); err != nil {
		return err
	}
	return s.rc.Flush()
}

var errAborted = status.Error(codes.DeadlineExceeded, "the watch was ended: its client took no batch in time")

func (s *restStream) Context() context.Context     { return s.ctx }
func (s *restStream) SetHeader(metadata.MD) error  { return nil }
func (s *restStream) SendHeader(metadata.MD) error { return nil }
func (s *restStream) SetTrailer(metadata.MD)       {}
func (s *restStream) SendMsg(m any) error          { return s.Send(m.(*leasev1.WatchProxiesResponse)) }
func (s *restStream) RecvMsg(any) error            { return io.EOF }
