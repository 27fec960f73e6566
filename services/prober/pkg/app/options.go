package app

import (
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
)

// Options are the prober's flags.
type Options struct {
	OpsAddr        string
	ControllerAddr string
	TokenFile      string
	ID             string
	Concurrency    int
	CAFile         string
	DenyCIDRs      string
	ControllerCA   string
	ServerName     string
	Insecure       bool
	Egress         netpolicy.EgressFlags

	// What Validate parsed.
	deny   netpolicy.DenyList
	egress netpolicy.Egress
	roots  *x509.CertPool
}

// Register adds the flags to fs.
func (o *Options) Register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&o.OpsAddr, "ops-addr", ":8081", "address of /healthz, /readyz and /metrics")
	fs.StringVar(&o.ControllerAddr, "controller-addr", "", "host:port of the controller's probe endpoint (required)")
	fs.StringVar(&o.TokenFile, "token-file", "", "file holding the bearer token the controller expects; empty sends none")
	fs.StringVar(&o.ID, "id", host, "this prober's stable id (the pod name in-cluster)")
	fs.IntVar(&o.Concurrency, "concurrency", 256, "probes in flight at most (bounds file descriptors); size it to at least assigned proxies x timeout / interval")
	fs.StringVar(&o.CAFile, "ca-file", "", "PEM CA bundle to verify probe targets with instead of the system roots")
	fs.StringVar(&o.ControllerCA, "controller-ca-file", "", "PEM CA bundle the controller's probe endpoint certificate is verified with (re-read on every reconnect)")
	fs.StringVar(&o.ServerName, "controller-server-name", "", "name the controller's certificate must hold; empty means the host of --controller-addr")
	fs.BoolVar(&o.Insecure, "controller-insecure", false, "connect to the controller in plaintext, without TLS: for local development only")
	fs.StringVar(&o.DenyCIDRs, "deny-cidrs", netpolicy.DefaultDenyCIDRs, "comma-separated CIDRs no proxy address may be in, checked after name resolution (keep it equal to the controller's --probe-deny-cidrs); private ranges stay allowed, proxies live there")
	o.Egress.Register(fs)
}

// Validate names the first bad flag and loads the deny list and the
// targets' CA bundle.
func (o *Options) Validate() error {
	switch {
	case o.ControllerAddr == "":
		return errors.New("--controller-addr is required (PROBER_CONTROLLER_ADDR)")
	case o.ID == "" || o.Concurrency < 1:
		return errors.New("--id must not be empty and --concurrency must be at least 1")
	case o.Insecure && o.ControllerCA != "":
		return errors.New("--controller-insecure contradicts --controller-ca-file: choose one")
	case !o.Insecure && o.ControllerCA == "":
		return errors.New("--controller-ca-file is required: the probe stream runs over TLS (--controller-insecure connects in plaintext, for local development only)")
	}
	var err error
	if o.deny, err = netpolicy.Parse(o.DenyCIDRs); err != nil {
		return fmt.Errorf("--deny-cidrs: %w", err)
	}
	if o.egress, err = o.Egress.Parse(); err != nil {
		return err
	}
	if o.CAFile != "" {
		if o.roots, err = certs.LoadPool(o.CAFile); err != nil {
			return fmt.Errorf("--ca-file: %w", err)
		}
	}
	return nil
}
