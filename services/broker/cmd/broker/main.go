// Command broker serves the lease API over gRPC and REST, keeping every
// lease and cooldown in Redis, and reads the proxy inventory from a
// read-only watch of Proxy objects.
package main

import (
	"context"
	"os"

	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/app"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	var o app.Options
	return service.Run(app.Name, "BROKER", args, os.Stderr, &o, func(ctx context.Context, env service.Env) error {
		return app.Run(ctx, env, o)
	})
}
