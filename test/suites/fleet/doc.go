// Package fleet is make bench-fleet: the whole system at fleet size
// (FLEET_N proxies) against baselines of its own run (the least a process
// can do for each service's job, package baseline), printing each figure
// as a ratio to its baseline; it asserts nothing timed.
//
// Runs on: the demo's system, envtest, real Squids.
package fleet
