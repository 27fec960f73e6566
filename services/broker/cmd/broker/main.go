// Command broker serves the lease API over gRPC and REST, keeping every
// lease and cooldown in Redis.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/egress-proxies/egress-proxies/pkg/service"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

type options struct {
	common  service.Common
	opsAddr string
}

func run(args []string) int {
	var o options
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	o.common.Register(fs)
	fs.StringVar(&o.opsAddr, "ops-addr", ":8081", "address of /healthz, /readyz and /metrics")
	return service.Run("broker", "BROKER", args, os.Stderr, fs, &o.common, func(ctx context.Context, env service.Env) error {
		ops := service.NewOps()
		wait, err := service.Serve(ctx, env.Log, "ops", o.opsAddr, ops.Handler())
		if err != nil {
			return service.UsageError{Err: err}
		}
		return wait()
	})
}
