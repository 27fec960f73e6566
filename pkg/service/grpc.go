package service

import (
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
)

// NewGRPCMetrics are the standard grpc_server_* series (started, handled
// and messages by service, method and code, and handling seconds) from
// go-grpc-middleware's Prometheus provider, so the dashboards and alerts
// written for every other gRPC service read ours too. Register them in the
// ops registry and put their interceptors on the server.
func NewGRPCMetrics() *grpcprom.ServerMetrics {
	return grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5})))
}
