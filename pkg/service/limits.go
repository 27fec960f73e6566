package service

import (
	"errors"
	"flag"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// Limits bound what one client of a server may hold: without them a
// thousand slow or idle clients (slowloris, streams opened and never
// used) hold a goroutine, a buffer and a file descriptor each for as
// long as they like. Every service serves its HTTP ports with them; the
// broker, which faces crawlers, sets them from flags.
type Limits struct {
	// HTTP: the whole request head, the whole request, the whole answer,
	// an idle keep-alive connection, and the request head's size.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                                            int
	// gRPC: the connection's handshake, the streams one connection may
	// have open, how long a connection may sit with no call, how often a
	// client may ping (more often and the server hangs up: ENHANCE_YOUR_CALM).
	GRPCHandshakeTimeout   time.Duration
	GRPCMaxStreams         uint
	GRPCMaxConnectionIdle  time.Duration
	GRPCKeepaliveMinTime   time.Duration
	GRPCKeepaliveInterval  time.Duration
	GRPCKeepaliveTimeout   time.Duration
	GRPCMaxConnectionAge   time.Duration
	GRPCMaxConnectionGrace time.Duration
}

// DefaultLimits are generous for a crawler, tight for a slow client.
var DefaultLimits = Limits{
	ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute,
	MaxHeaderBytes:       64 << 10,
	GRPCHandshakeTimeout: 10 * time.Second, GRPCMaxStreams: 1000, GRPCMaxConnectionIdle: 15 * time.Minute,
	GRPCKeepaliveMinTime: 10 * time.Second, GRPCKeepaliveInterval: 2 * time.Minute, GRPCKeepaliveTimeout: 20 * time.Second,
}

// Register adds one flag per limit to fs, defaulting to l's values.
func (l *Limits) Register(fs *flag.FlagSet) {
	fs.DurationVar(&l.ReadHeaderTimeout, "http-read-header-timeout", l.ReadHeaderTimeout, "longest a REST or ops client may take to send a request's head")
	fs.DurationVar(&l.ReadTimeout, "http-read-timeout", l.ReadTimeout, "longest a REST or ops client may take to send a whole request")
	fs.DurationVar(&l.WriteTimeout, "http-write-timeout", l.WriteTimeout, "longest a REST or ops answer may take to be written")
	fs.DurationVar(&l.IdleTimeout, "http-idle-timeout", l.IdleTimeout, "longest a REST or ops keep-alive connection may sit idle")
	fs.IntVar(&l.MaxHeaderBytes, "http-max-header-bytes", l.MaxHeaderBytes, "largest REST or ops request head")
	fs.DurationVar(&l.GRPCHandshakeTimeout, "grpc-handshake-timeout", l.GRPCHandshakeTimeout, "longest a gRPC client may take to set up its connection (TLS and HTTP/2 preface)")
	fs.UintVar(&l.GRPCMaxStreams, "grpc-max-concurrent-streams", l.GRPCMaxStreams, "most gRPC calls one connection may have open at once")
	fs.DurationVar(&l.GRPCMaxConnectionIdle, "grpc-max-connection-idle", l.GRPCMaxConnectionIdle, "a gRPC connection with no call for this long is closed (clients reconnect)")
	fs.DurationVar(&l.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", l.GRPCKeepaliveMinTime, "a gRPC client pinging more often than this is disconnected (ENHANCE_YOUR_CALM)")
	fs.DurationVar(&l.GRPCKeepaliveInterval, "grpc-keepalive-interval", l.GRPCKeepaliveInterval, "how often the server pings a quiet gRPC connection to find dead clients")
	fs.DurationVar(&l.GRPCKeepaliveTimeout, "grpc-keepalive-timeout", l.GRPCKeepaliveTimeout, "how long a ping may go unanswered before the connection is closed")
	fs.DurationVar(&l.GRPCMaxConnectionAge, "grpc-max-connection-age", l.GRPCMaxConnectionAge, "a gRPC connection older than this is asked to reconnect, so clients spread over new brokers (0: never)")
	fs.DurationVar(&l.GRPCMaxConnectionGrace, "grpc-max-connection-age-grace", l.GRPCMaxConnectionGrace, "calls in flight on a connection past --grpc-max-connection-age get this long to finish (0: no limit)")
}

// Validate names the first bad limit.
func (l Limits) Validate() error {
	if l.ReadHeaderTimeout <= 0 || l.ReadTimeout <= 0 || l.WriteTimeout <= 0 || l.IdleTimeout <= 0 || l.MaxHeaderBytes < 1024 {
		return errors.New("--http-read-header-timeout, --http-read-timeout, --http-write-timeout and --http-idle-timeout must be positive, --http-max-header-bytes at least 1024")
	}
	if l.GRPCHandshakeTimeout <= 0 || l.GRPCMaxStreams < 1 || l.GRPCMaxConnectionIdle <= 0 || l.GRPCKeepaliveMinTime <= 0 || l.GRPCKeepaliveInterval <= 0 || l.GRPCKeepaliveTimeout <= 0 {
		return errors.New("--grpc-handshake-timeout, --grpc-max-connection-idle and the keepalive times must be positive, --grpc-max-concurrent-streams at least 1")
	}
	return nil
}

// HTTPServer is an http.Server for h with the HTTP limits.
func (l Limits) HTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout, WriteTimeout: l.WriteTimeout,
		IdleTimeout: l.IdleTimeout, MaxHeaderBytes: l.MaxHeaderBytes}
}

// GRPCOptions are the gRPC server options enforcing the gRPC limits.
func (l Limits) GRPCOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(l.GRPCHandshakeTimeout),
		grpc.MaxConcurrentStreams(uint32(min(l.GRPCMaxStreams, 1<<31))),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: l.GRPCKeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: l.GRPCMaxConnectionIdle, Time: l.GRPCKeepaliveInterval, Timeout: l.GRPCKeepaliveTimeout,
			MaxConnectionAge: l.GRPCMaxConnectionAge, MaxConnectionAgeGrace: l.GRPCMaxConnectionGrace}),
	}
}
