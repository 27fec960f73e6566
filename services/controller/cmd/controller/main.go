// Command controller reconciles Proxy objects through the configured
// providers, collects orphaned instances, and is the one writer of Proxy
// status, health included.
package main

import (
	"context"
	"os"

	"github.com/egress-proxies/egress-proxies/pkg/service"
	"github.com/egress-proxies/egress-proxies/services/controller/pkg/app"
)

func main() { os.Exit(run(os.Args[1:])) }

func run(args []string) int {
	var o app.Options
	return service.Run(app.Name, "CONTROLLER", args, os.Stderr, &o, func(ctx context.Context, env service.Env) error {
		return app.Run(ctx, env, o)
	})
}
