// Package probes proves health checking end to end: Healthy with the
// egress IP; a CONNECT refused and a silent tunnel; an unknown CA; one
// prober per proxy; no status writes when steady; a killed prober's share
// probed again; a reconnect to a restarted controller; a Squid killed and
// restarted.
//
// Runs on: the controller and 3 prober processes, envtest, real Squids,
// TLS targets with their own CA.
package probes
