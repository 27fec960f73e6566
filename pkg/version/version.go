// Package version carries the build's commit, set at link time:
// -ldflags "-X github.com/egress-proxies/egress-proxies/pkg/version.Commit=<sha>".
package version

// Commit is the git commit the binary was built from.
var Commit = "unknown"
