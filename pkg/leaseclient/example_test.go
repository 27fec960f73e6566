package leaseclient_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"strings"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// A crawler leases a proxy in the EU for one target, keeps the lease alive
// while it works, reports a rate limit, and releases the lease.
func Example() {
	ctx := context.Background()
	c, err := leaseclient.Dial("egress-proxies-broker:9090", leaseclient.WithToken("token-from-a-secret"))
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = c.Close() }()

	l, err := c.Lease(ctx, leaseclient.Request{Selector: map[string]string{"geo": "eu"}, Target: "example.com", TTL: 5 * time.Minute})
	var none *leaseclient.NoProxyError
	if errors.As(err, &none) {
		log.Printf("no proxy (%s); retrying in %s", none.Reason, none.RetryAfter)
		return
	}
	if err != nil {
		log.Fatal(err)
	}
	defer func() { _ = l.Release(context.Background()) }()
	stop := l.AutoRenew(ctx, time.Minute, 5*time.Minute, func(err error) { log.Print(err) })
	defer stop()

	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(l.ProxyURL())}}
	start := time.Now()
	resp, err := hc.Get("https://example.com/")
	o := leaseclient.Outcome{Latency: time.Since(start)}
	switch {
	case err != nil && strings.Contains(err.Error(), "proxyconnect"):
		o.Result = leaseclient.ResultError // the proxy itself did not answer
	case err != nil:
		o.Result = leaseclient.ResultTargetError // past the proxy: the site's doing
	default:
		// The fault table judges the answer (a 5xx is the site's, a 429 a
		// rate limit, a captcha page a block).
		o.Result, o.StatusCode = string(faults.Response(resp.StatusCode, resp.Header, nil)), resp.StatusCode
	}
	if v, err := l.Report(ctx, o); err == nil {
		log.Printf("the broker: %v", v.GetActions())
	}
}
