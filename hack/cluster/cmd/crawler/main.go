// Command crawler is the end-to-end test's crawler pod: it does what
// crawler code does with the lease API, once over REST and once over gRPC
// (the Go client), and prints each step as a JSON line for the test to
// check. Per protocol: lease for the target, fetch the target's /ip
// through the leased proxy with the lease's credentials, fetch /ban (the
// target answers 429), report rate_limited, lease again for the target
// (the cooled proxy must not come back while another qualifies), release
// both leases, and release again (204 both times over REST). Then, with
// no lease API code at all, through the gateway (another name of the
// target, so its cooldowns are its own): a fetch, a refused way inside, a
// session that keeps its proxy, a block seen inside TLS reported by
// session, and the session moving off the cooled proxy.
//
// With --tenant-for, it is one tenant's crawler instead: it lists what it
// sees, is refused another tenant's namespace, then leases (naming no
// namespace, for --lease-target) for that long, each lease released
// (with --report, after reporting that result on it); it prints what it
// leased, was refused and what its reports did.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

type config struct {
	rest, grpc, tokenFile, brokerCA string
	gateway, gatewayTokenFile       string
	targetURL, targetCA, namespace  string
	selector                        map[string]string
	// tenantFor, otherNamespace and leaseTarget: the tenant mode.
	tenantFor                           time.Duration
	otherNamespace, leaseTarget, report string
}

func main() {
	var c config
	var selector string
	flag.StringVar(&c.rest, "rest", "", "the broker's REST base URL (http://... or https://...)")
	flag.StringVar(&c.grpc, "grpc", "", "the broker's gRPC address (host:port)")
	flag.StringVar(&c.tokenFile, "token-file", "", "file holding the lease API's bearer token")
	flag.StringVar(&c.brokerCA, "broker-ca-file", "", "CA of the broker's certificate; set: REST and gRPC over TLS")
	flag.StringVar(&c.gateway, "gateway", "", "the broker's proxy gateway (host:port); empty skips it")
	flag.StringVar(&c.gatewayTokenFile, "gateway-token-file", "", "file holding the gateway's password (the chart's gateway-only token)")
	flag.StringVar(&c.targetURL, "target", "", "base URL of the crawl target (https://...)")
	flag.StringVar(&c.targetCA, "target-ca-file", "", "CA of the target's certificate")
	flag.StringVar(&c.namespace, "namespace", "", "namespace of the Proxies to lease")
	flag.StringVar(&selector, "selector", "", "attributes to lease by, k=v,k=v")
	flag.DurationVar(&c.tenantFor, "tenant-for", 0, "set: be one tenant's crawler for this long (see the package doc)")
	flag.StringVar(&c.otherNamespace, "other-namespace", "", "with --tenant-for: a namespace that is another tenant's")
	flag.StringVar(&c.leaseTarget, "lease-target", "", "with --tenant-for: the target its leases are for")
	flag.StringVar(&c.report, "report", "", "with --tenant-for: the result to report on every lease (blocked: a ban storm)")
	flag.Parse()
	c.selector = map[string]string{}
	for _, kv := range strings.Split(selector, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			c.selector[k] = v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, c); err != nil {
		emit(map[string]any{"step": "failed", "error": err.Error()})
		os.Exit(1)
	}
	emit(map[string]any{"step": "done"})
}

func emit(v map[string]any) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func run(ctx context.Context, c config) error {
	tokenBytes, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return err
	}
	token := strings.TrimSpace(string(tokenBytes))
	targetRoots, err := certs.LoadPool(c.targetCA)
	if err != nil {
		return err
	}
	var brokerTLS *tls.Config
	if c.brokerCA != "" {
		roots, err := certs.LoadPool(c.brokerCA)
		if err != nil {
			return err
		}
		brokerTLS = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	target, err := url.Parse(c.targetURL)
	if err != nil {
		return err
	}
	r := &rest{base: strings.TrimSuffix(c.rest, "/"), token: token,
		http: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: brokerTLS}}}
	if c.tenantFor > 0 {
		return r.asTenant(ctx, c)
	}
	if err := r.walk(ctx, c, target.Hostname(), targetRoots); err != nil {
		return fmt.Errorf("REST: %w", err)
	}
	opts := []leaseclient.Option{leaseclient.WithToken(token)}
	if brokerTLS != nil {
		opts = append(opts, leaseclient.WithTLS(credentials.NewTLS(brokerTLS)))
	}
	g, err := leaseclient.Dial(c.grpc, opts...)
	if err != nil {
		return err
	}
	defer g.Close()
	if err := walkGRPC(ctx, g, c, target.Hostname(), targetRoots); err != nil {
		return fmt.Errorf("gRPC: %w", err)
	}
	if c.gateway != "" {
		gw, err := os.ReadFile(c.gatewayTokenFile)
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		if err := r.walkGateway(ctx, c, strings.TrimSpace(string(gw)), targetRoots); err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
	}
	return nil
}

// asTenant is one tenant's crawler (the package doc says what it does).
func (r *rest) asTenant(ctx context.Context, c config) error {
	var list struct {
		Proxies []struct {
			ID string `json:"id"`
		} `json:"proxies"`
	}
	if _, err := r.call(ctx, http.MethodGet, "/v1/proxies", nil, &list); err != nil {
		return err
	}
	var ids []string
	for _, p := range list.Proxies {
		ids = append(ids, p.ID)
	}
	emit(map[string]any{"step": "tenant-list", "proxies": ids})
	code, err := r.call(ctx, http.MethodGet, "/v1/proxies?namespace="+c.otherNamespace, nil, nil)
	emit(map[string]any{"step": "tenant-other", "status": code, "error": fmt.Sprint(err)})

	leased, refused, actions := map[string]int{}, map[string]int{}, map[string]int{}
	n := 0
	for end := time.Now().Add(c.tenantFor); time.Now().Before(end); {
		var l restLease
		if code, err := r.call(ctx, http.MethodPost, "/v1/leases", map[string]any{"target": c.leaseTarget, "ttlSeconds": 60}, &l); err != nil {
			refused[fmt.Sprint(code)]++
			time.Sleep(50 * time.Millisecond)
			continue
		}
		n++
		leased[l.Proxy.ID]++
		if c.report != "" {
			var v struct {
				Actions []string `json:"actions"`
			}
			if _, err := r.call(ctx, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report", map[string]any{"result": c.report, "target": c.leaseTarget}, &v); err != nil {
				return err
			}
			actions[strings.Join(v.Actions, ",")]++
		}
		if _, err := r.call(ctx, http.MethodDelete, "/v1/leases/"+l.LeaseID, nil, nil); err != nil {
			return err
		}
	}
	emit(map[string]any{"step": "tenant-leases", "leases": n, "byProxy": leased, "refused": refused, "reports": actions})
	return nil
}

// walkGateway crawls through the gateway as any HTTP client would: the
// proxy URL carries the options and the gateway token, nothing else; the
// lease API refuses that token a lease, and takes its session's report.
func (r *rest) walkGateway(ctx context.Context, c config, gwToken string, roots *x509.CertPool) error {
	base := strings.Replace(c.targetURL, ".svc.cluster.local", ".svc", 1)
	host := strings.TrimPrefix(base, "https://")
	proxy := func(session string) *url.URL {
		user := "namespace=" + c.namespace
		for k, v := range c.selector {
			user += ",attr." + k + "=" + v
		}
		if session != "" {
			user += ",session=" + session
		}
		return &url.URL{Scheme: "http", User: url.UserPassword(user, gwToken), Host: c.gateway}
	}
	api := &rest{base: r.base, token: gwToken, http: r.http}
	status, err := api.call(ctx, http.MethodPost, "/v1/leases", map[string]any{"ttlSeconds": 60}, nil)
	if err != nil && status == 0 {
		return err
	}
	emit(map[string]any{"step": "gateway-token-api", "status": status})
	code, ip, err := fetch(proxy(""), roots, base+"/ip")
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "gateway-fetch", "status": code, "egressIP": ip})
	code, body, err := fetch(proxy(""), roots, "http://169.254.169.254/computeMetadata/v1/")
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "gateway-inside", "status": code, "answer": body})
	var ips []string
	for range 2 {
		_, ip, err := fetch(proxy("e2e-1"), roots, base+"/ip")
		if err != nil {
			return err
		}
		ips = append(ips, ip)
	}
	emit(map[string]any{"step": "gateway-session", "egressIPs": ips})
	code, _, err = fetch(proxy("e2e-1"), roots, base+"/ban")
	if err != nil {
		return err
	}
	// The session is the gateway credential's: it reports with it.
	var report map[string]any
	if _, err := api.call(ctx, http.MethodPost, "/v1/sessions/e2e-1/report",
		map[string]any{"result": "rate_limited", "target": host, "statusCode": code}, &report); err != nil {
		return err
	}
	emit(map[string]any{"step": "gateway-report", "status": code, "answer": report})
	_, ip, err = fetch(proxy("e2e-1"), roots, base+"/ip")
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "gateway-moved", "egressIP": ip})
	return nil
}

// fetch GETs target path through the proxy; the proxy URL carries the
// lease's credentials, which Go sends on CONNECT.
func fetch(proxy *url.URL, roots *x509.CertPool, u string) (int, string, error) {
	tr := &http.Transport{Proxy: http.ProxyURL(proxy), TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	defer tr.CloseIdleConnections() // a gateway tunnel's lease ends with it
	client := &http.Client{Timeout: 10 * time.Second, Transport: tr}
	resp, err := client.Get(u)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b)), nil
}

// insideURLs are destinations no leased proxy may reach: the cloud
// metadata address, the pod's own loopback, Squid's cache manager, the
// API server's Service and the node's kubelet.
func insideURLs(proxyIP string, proxyPort int) []string {
	return []string{
		"http://169.254.169.254/computeMetadata/v1/",
		"http://127.0.0.1:22/",
		fmt.Sprintf("http://%s/squid-internal-mgr/info", net.JoinHostPort(proxyIP, fmt.Sprint(proxyPort))),
		"https://kubernetes.default.svc.cluster.local/version",
		"http://10.244.0.1:10250/pods",
	}
}

type rest struct {
	base, token string
	http        *http.Client
}

func (r *rest) call(ctx context.Context, method, path string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, r.base+path, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Authorization", "Bearer "+r.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if out != nil && len(b) > 0 {
		return resp.StatusCode, json.Unmarshal(b, out)
	}
	return resp.StatusCode, nil
}

type restLease struct {
	LeaseID string `json:"leaseID"`
	Proxy   struct {
		ID   string `json:"id"`
		IP   string `json:"ip"`
		Port int    `json:"port"`
	} `json:"proxy"`
	Credentials *struct{ Username, Password string } `json:"credentials"`
}

func (l restLease) url() *url.URL {
	u := &url.URL{Scheme: "http", Host: fmt.Sprintf("%s:%d", l.Proxy.IP, l.Proxy.Port)}
	if l.Credentials != nil {
		u.User = url.UserPassword(l.Credentials.Username, l.Credentials.Password)
	}
	return u
}

func (r *rest) lease(ctx context.Context, c config, host string) (restLease, error) {
	var l restLease
	_, err := r.call(ctx, http.MethodPost, "/v1/leases", map[string]any{
		"selector": c.selector, "namespace": c.namespace, "target": host, "ttlSeconds": 120,
		"requestId": fmt.Sprintf("crawler-%d", time.Now().UnixNano()),
	}, &l)
	return l, err
}

func (r *rest) walk(ctx context.Context, c config, host string, roots *x509.CertPool) error {
	l, err := r.lease(ctx, c, host)
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "rest-lease", "lease": l.LeaseID, "proxy": l.Proxy.ID, "credentials": l.Credentials != nil})
	code, body, err := fetch(l.url(), roots, c.targetURL+"/ip")
	if err != nil {
		return fmt.Errorf("fetching through %s: %w", l.Proxy.ID, err)
	}
	emit(map[string]any{"step": "rest-fetch", "status": code, "egressIP": body})
	// What an attacker holding this lease would try: every way inside.
	for _, u := range insideURLs(l.Proxy.IP, l.Proxy.Port) {
		code, _, err := fetch(l.url(), roots, u)
		if err != nil {
			// Go reports a refused CONNECT as an error naming the status.
			if !strings.Contains(err.Error(), "Forbidden") {
				return fmt.Errorf("fetching %s through %s: %w", u, l.Proxy.ID, err)
			}
			code = http.StatusForbidden
		}
		emit(map[string]any{"step": "rest-inside", "url": u, "status": code})
	}
	code, _, err = fetch(l.url(), roots, c.targetURL+"/ban")
	if err != nil {
		return err
	}
	var report map[string]any
	if _, err := r.call(ctx, http.MethodPost, "/v1/leases/"+l.LeaseID+"/report",
		map[string]any{"result": "rate_limited", "target": host, "statusCode": code}, &report); err != nil {
		return err
	}
	emit(map[string]any{"step": "rest-report", "status": code, "answer": report})
	again, err := r.lease(ctx, c, host)
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "rest-lease-again", "proxy": again.Proxy.ID})
	for _, id := range []string{l.LeaseID, again.LeaseID, l.LeaseID} {
		status, err := r.call(ctx, http.MethodDelete, "/v1/leases/"+id, nil, nil)
		if err != nil {
			return err
		}
		emit(map[string]any{"step": "rest-release", "lease": id, "status": status})
	}
	return nil
}

func walkGRPC(ctx context.Context, g *leaseclient.Client, c config, host string, roots *x509.CertPool) error {
	req := leaseclient.Request{Selector: c.selector, Namespace: c.namespace, Target: host, TTL: 2 * time.Minute}
	l, err := g.Lease(ctx, req)
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "grpc-lease", "lease": l.ID, "proxy": l.Proxy.GetId(), "credentials": l.Credentials != nil})
	code, body, err := fetch(l.ProxyURL(), roots, c.targetURL+"/ip")
	if err != nil {
		return fmt.Errorf("fetching through %s: %w", l.Proxy.GetId(), err)
	}
	emit(map[string]any{"step": "grpc-fetch", "status": code, "egressIP": body})
	start := time.Now()
	code, _, err = fetch(l.ProxyURL(), roots, c.targetURL+"/ban")
	if err != nil {
		return err
	}
	answer, err := l.Report(ctx, leaseclient.Outcome{Result: leaseclient.ResultRateLimited, StatusCode: code, Latency: time.Since(start)})
	if err != nil {
		return err
	}
	emit(map[string]any{"step": "grpc-report", "status": code, "actions": answer.GetActions(),
		"cooldownUntil": answer.GetCooldownUntil().AsTime()})
	again, err := g.Lease(ctx, req)
	var none *leaseclient.NoProxyError
	switch {
	case errors.As(err, &none):
		emit(map[string]any{"step": "grpc-lease-again", "refused": none.Reason})
	case err != nil:
		return err
	default:
		emit(map[string]any{"step": "grpc-lease-again", "proxy": again.Proxy.GetId()})
		if err := again.Release(ctx); err != nil {
			return err
		}
	}
	if err := l.Release(ctx); err != nil {
		return err
	}
	emit(map[string]any{"step": "grpc-release", "lease": l.ID})
	return nil
}
