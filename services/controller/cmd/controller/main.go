// Command controller reconciles Proxy objects through the configured
// providers, collects orphaned instances, and is the one writer of Proxy
// status, health included.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/operator"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var o operator.Options
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	o.Register(fs)
	return service.Run("controller", "CONTROLLER", args, os.Stderr, fs, &o.Common, func(ctx context.Context, env service.Env) error {
		return operator.Run(ctx, env.Log, o)
	})
}
