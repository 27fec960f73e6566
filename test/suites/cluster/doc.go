// Package cluster proves the product installed and used as its users do,
// on a real single-node cluster with real Pods (make e2e-cluster): helm
// install, a ProxyPool of Squid pods, crawler pods of two tenants at once,
// kubectl egress, a ProxySource, scaling, faults, an upgrade, broker TLS
// and the gateway, uninstall; step by step, as docs/testing.md lists.
//
// Runs on: a single-node cluster built from source (hack/cluster), images
// built here, the pinned helm.
package cluster
