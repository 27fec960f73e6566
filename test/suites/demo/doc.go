// Package demo proves the three services together, with their faults:
// the quickstart across brokers and a real fetch through the leased
// proxy; replacement seen by a polling client; deletion, also mid-create
// with the controller down; orphan GC of an unrecorded pod; a broker
// SIGKILLed under traffic; a Squid killed; Redis restarted; the API
// server partitioned; bad input at the edges; two controller replicas
// behind a per-connection round-robin balancer, the leader killed, then a
// rollout, every proxy probed for the new leader within 2 intervals; every
// prober stopped (no proxy healthy within the stale limit, leases refused
// HEALTH_STALE, back when probers return); all over TLS; a bought proxy
// behind Basic auth; a Managed proxy's derived credentials; a quarantine
// by error reports through both brokers ended at the prober's next
// success; a Decodo ProxySource of 50 sessions × 2 countries on the vendor
// stand-in, crawled through the gateway.
//
// Runs on: the demo's system (hack/demo/system): all services as
// processes, Redis, Squids, the kubelet stand-in, envtest.
package demo
