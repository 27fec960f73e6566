// Package squidconf is the squid.conf of every Squid this project runs: the
// kubernetes provider's pods and every Squid of the suites, so the config
// the tests hold to account is the one users run. It is a whole
// config, not lines spliced into an image's own: what a proxy lets through
// must not depend on which Squid image a Proxy names.
package squidconf

import (
	"fmt"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
)

// Config is one Squid's.
type Config struct {
	// Listen is http_port's value: "3128" (every address), "127.0.0.1:3128".
	Listen string
	// AuthHelper is the path of proxyauth's helper script admitting the
	// proxy's credentials; "" makes an open proxy (no credentials key).
	AuthHelper string
	// Egress is where clients may go.
	Egress netpolicy.Egress
	// Dir is where Squid writes its pid file and cache log; "" writes
	// neither (a pod: its root file system is read-only, its log is the
	// container's stderr with -d 1).
	Dir string
	// ShutdownLifetime is how long Squid waits for clients when told to
	// stop (its default is 30 s).
	ShutdownLifetime time.Duration
	// AccessLog is a file Squid logs every request to; "" logs none (what
	// a crawler fetched is its own business). The suites log, to see each
	// request went through the proxy it leased.
	AccessLog string
	// ConnectTimeout is how long Squid tries to reach a site before it
	// answers ERR_CONNECT_FAIL itself (0: DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// OutgoingAddress is the source address Squid dials from; "" lets the
	// kernel pick. The suites' Squids each listen on a 127.x.y.z of their
	// own and egress from it, so a target tells them apart as sites tell
	// real proxies apart: by exit IP.
	OutgoingAddress string
}

// DefaultConnectTimeout is below the gateway's wait for a CONNECT's answer
// (--gateway-dial-timeout, 10 s) and the prober's: a site that drops
// SYNs is answered by Squid as the site's failure (ERR_CONNECT_FAIL) before
// the client gives up on the proxy and blames it. Squid's own default is a
// minute.
const DefaultConnectTimeout = 8 * time.Second

// AuthACL is the ACL naming clients with the proxy's credentials.
const AuthACL = "egress_authenticated"

// String renders the config.
func (c Config) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "http_port %s\n", c.Listen)
	if c.Dir != "" {
		fmt.Fprintf(&b, "pid_filename %[1]s/squid.pid\ncache_log %[1]s/cache.log\n", c.Dir)
	} else {
		b.WriteString("pid_filename none\ncache_log /dev/null\n")
	}
	fmt.Fprintf(&b, "shutdown_lifetime %d seconds\n", int(c.ShutdownLifetime.Seconds()))
	connect := c.ConnectTimeout
	if connect <= 0 {
		connect = DefaultConnectTimeout
	}
	fmt.Fprintf(&b, "connect_timeout %d seconds\n", max(1, int(connect.Seconds())))
	if c.AccessLog != "" {
		fmt.Fprintf(&b, "access_log stdio:%s squid\n", c.AccessLog)
	} else {
		b.WriteString("access_log none\n")
	}
	if c.OutgoingAddress != "" {
		fmt.Fprintf(&b, "tcp_outgoing_address %s\n", c.OutgoingAddress)
	}
	// No disk, and nothing in a forwarded request that says where it came
	// from.
	b.WriteString(`cache deny all
netdb_filename none
pinger_enable off
via off
forwarded_for delete
httpd_suppress_version_string on
`)
	admit := "all"
	if c.AuthHelper != "" {
		admit = AuthACL
		fmt.Fprintf(&b, "auth_param basic program /bin/sh %s\nauth_param basic realm egress-proxies\nacl %s proxy_auth REQUIRED\n", c.AuthHelper, AuthACL)
	}
	b.WriteString(c.Egress.SquidRules(admit))
	return b.String()
}
