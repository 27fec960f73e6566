// Package health decides and writes every Proxy's health. It is fed by
// gRPC, not by a watch, so it is not a reconciler: the Hub is its front
// door, the endpoint the prober fleet connects to, which gives every
// probe-able Proxy to exactly one connected prober and hands every result
// to the Engine; the Engine counts results against thresholds and writes
// the Healthy condition, status.healthy, status.egressIP,
// status.lastHealthCheckTime and status.healthInstanceGeneration, which no
// other writer touches (docs/api/status-writers.md, "Who writes what").
package health
