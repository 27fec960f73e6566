// Package service is the skeleton every binary shares: flags with
// environment fallbacks, structured logging, tracing, an ops HTTP server for
// health and metrics, and shutdown on SIGTERM.
package service

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// ParseFlags parses args into fs, then fills every flag not given on the
// command line from the environment variable PREFIX_FLAG_NAME (dashes
// become underscores, upper case): --redis-addr reads BROKER_REDIS_ADDR.
// The command line wins over the environment. An error names the flag or
// variable and what was wrong with it.
func ParseFlags(fs *flag.FlagSet, prefix string, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: every setting is a --flag", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := EnvName(prefix, f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment variable %s=%q (for --%s): %v", env, v, f.Name, e)
			}
		}
	})
	return err
}

// EnvName is the environment variable that backs a flag.
func EnvName(prefix, flagName string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
