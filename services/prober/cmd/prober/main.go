// Command prober is one member of the probe fleet: it connects to the
// controller over gRPC, probes the proxies assigned to it through real
// CONNECT tunnels, and streams the results back. It holds no Kubernetes
// credentials; scale it on its own.
package main

import (
	"context"
	"os"

	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/services/prober/pkg/app"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	var o app.Options
	return service.Run(app.Name, "PROBER", args, os.Stderr, &o, func(ctx context.Context, env service.Env) error {
		return app.Run(ctx, env, o)
	})
}
