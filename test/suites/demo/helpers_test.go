package demo

import (
	"crypto/tls"
	"net/url"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
)

func mustURL(s string) *url.URL {
	u, err := url.Parse(s)
	if err != nil {
		panic(err)
	}
	return u
}

func tlsTo(s *system.System) *tls.Config {
	return &tls.Config{RootCAs: s.Target.Pool(), MinVersion: tls.VersionTLS12}
}
