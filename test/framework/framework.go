// Package framework is what the system suites (test/suites/...) share to
// run the product the way its users do: a broker process (Broker), the
// real cluster `make e2e-cluster` brings up (Cluster), and the table of
// what each suite proves (Suites, from the suites' own package comments).
//
// The parts below it are the ones the packages' own tests use too, so
// they live beside the code in the pkg module: an API server built from
// source (pkg/testenv), processes, Redis and Squids
// (pkg/testutil/proc), a kubelet stand-in (pkg/testutil/kubelet), and
// the demo's whole system in one process tree (hack/demo/system).
package framework
