// Command prober is one member of the probe fleet: it connects to the
// controller over gRPC, probes the proxies assigned to it through real
// CONNECT tunnels, and streams the results back. It holds no Kubernetes
// credentials.
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
	fs := flag.NewFlagSet("prober", flag.ContinueOnError)
	o.common.Register(fs)
	fs.StringVar(&o.opsAddr, "ops-addr", ":8081", "address of /healthz, /readyz and /metrics")
	return service.Run("prober", "PROBER", args, os.Stderr, fs, &o.common, func(ctx context.Context, env service.Env) error {
		ops := service.NewOps()
		wait, err := service.Serve(ctx, env.Log, "ops", o.opsAddr, ops.Handler())
		if err != nil {
			return service.UsageError{Err: err}
		}
		return wait()
	})
}
