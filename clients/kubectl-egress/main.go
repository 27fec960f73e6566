// kubectl-egress is the operator's window on an egress-proxies install:
// `kubectl egress status`, explain, bans, leases, cordon, drain, rotate
// and check, from the user's kubeconfig and the brokers' lease API.
// Copied onto PATH it is a kubectl plugin (docs/operations.md).
package main

import (
	"os"

	"github.com/egress-proxies/egress-proxies/clients/kubectl-egress/internal/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr)) }
