package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/faults"
	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// checkFlags are check <url>'s.
type checkFlags struct {
	pool, caFile string
	count        int
	report       bool
	fetchTimeout time.Duration
}

// exitResult is one exit's answer in check <url>.
type exitResult struct {
	Proxy     string  `json:"proxy"`
	EgressIP  string  `json:"egressIP,omitempty"`
	Status    int     `json:"status,omitempty"`
	LatencyMs float64 `json:"latencyMs"`
	// Verdict is the default ban policy's result: ok, rate_limited,
	// blocked, error (the proxy's fault) or target_error (the site's).
	Verdict string `json:"verdict"`
	Detail  string `json:"detail,omitempty"`
	// Reported is what the brokers did with the verdict, with --report.
	Reported []string `json:"reported,omitempty"`
}

// checkURL fetches raw through every healthy member of a pool (or
// count of them), each leased and released after; nothing is reported
// unless asked. The leases name no target, so an exit cooling down for
// the site is checked too: whether the site still turns it away is what
// an operator asks.
func (e *env) checkURL(ctx context.Context, raw string, f checkFlags) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an http or https URL", raw)
	}
	if f.pool == "" {
		return fmt.Errorf("--pool is required: the ProxyPool whose members fetch the URL")
	}
	var pool v1.ProxyPool
	key := client.ObjectKey{Namespace: e.namespace, Name: f.pool}
	if err := e.kube.Get(ctx, key, &pool); err != nil {
		return fmt.Errorf("reading ProxyPool %s: %w", key, err)
	}
	var list v1.ProxyList
	if err := e.kube.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{v1.LabelPool: pool.Name}); err != nil {
		return fmt.Errorf("listing the pool's members: %w", err)
	}
	members := map[string]bool{}
	for _, px := range list.Items {
		if px.Status.IsHealthy() {
			members[px.Key()] = true
		}
	}
	want := len(members)
	if f.count > 0 {
		want = min(want, f.count)
	}
	transport := &http.Transport{DisableKeepAlives: true}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return fmt.Errorf("--target-ca-file: %w", err)
		}
		roots, err := x509.SystemCertPool()
		if err != nil {
			roots = x509.NewCertPool()
		}
		if !roots.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--target-ca-file %s holds no PEM certificate", f.caFile)
		}
		transport.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}

	c, done, err := e.leaseClient(ctx)
	if err != nil {
		return err
	}
	defer done()
	// Held leases steer the next to another proxy (the least loaded), so
	// want leases cover want members; one on a proxy outside the pool
	// (the same attributes) is held too, and skipped.
	var mine, others []*leaseclient.Lease
	defer func() {
		for _, l := range append(mine, others...) {
			_ = l.Release(context.WithoutCancel(ctx))
		}
	}()
	seen := map[string]bool{}
	var stopped error
	for len(mine) < want && len(mine)+len(others) < 2*want+10 {
		l, err := c.Lease(ctx, leaseclient.Request{Namespace: pool.Namespace, Selector: pool.Spec.Template.Spec.Attributes, TTL: 2 * time.Minute})
		if err != nil {
			stopped = err
			break
		}
		id := l.Proxy.GetId()
		if !members[id] || seen[id] {
			others = append(others, l)
			continue
		}
		seen[id] = true
		mine = append(mine, l)
	}
	results := make([]exitResult, len(mine))
	var wg sync.WaitGroup
	for i, l := range mine {
		wg.Go(func() { results[i] = fetchThrough(ctx, transport, l, u, f.fetchTimeout) })
	}
	wg.Wait()
	if f.report {
		for i, l := range mine {
			r := results[i]
			if r.Verdict == "" {
				continue
			}
			resp, err := l.Report(ctx, leaseclient.Outcome{Result: r.Verdict, Target: u.Hostname(), StatusCode: r.Status, Latency: time.Duration(r.LatencyMs * float64(time.Millisecond))})
			if err != nil {
				results[i].Reported = []string{"report failed: " + err.Error()}
			} else {
				results[i].Reported = resp.GetActions()
			}
		}
	}
	sort.Slice(results, func(a, b int) bool { return results[a].Proxy < results[b].Proxy })
	bad := 0
	for _, r := range results {
		if r.Verdict != string(faults.OK) {
			bad++
		}
	}
	note := ""
	if len(results) < want {
		note = fmt.Sprintf("%d of the pool's %d healthy members could be leased", len(results), want)
		if stopped != nil {
			note += ": " + stopped.Error()
		}
	}
	err = e.emit(map[string]any{"url": raw, "exits": results, "note": note}, func(w io.Writer) {
		row(w, "PROXY", "EGRESS IP", "STATUS", "LATENCY", "VERDICT", "DETAIL")
		for _, r := range results {
			status := "-"
			if r.Status > 0 {
				status = fmt.Sprint(r.Status)
			}
			detail := r.Detail
			if len(r.Reported) > 0 {
				detail = strings.TrimSpace(detail + " reported: " + strings.Join(r.Reported, ","))
			}
			row(w, r.Proxy, dash(r.EgressIP), status, fmt.Sprintf("%.0fms", r.LatencyMs), r.Verdict, dash(detail))
		}
		if note != "" {
			row(w, "")
			row(w, note)
		}
	})
	if err != nil {
		return err
	}
	if bad > 0 || len(results) == 0 {
		return &exitError{code: 2, msg: fmt.Sprintf("%d of %d exits did not fetch %s cleanly", bad+want-len(results), want, raw)}
	}
	return nil
}

// fetchThrough GETs u through the leased proxy and judges the answer as
// the default ban policy does; a failed CONNECT is judged by the
// proxy's answer to it.
func fetchThrough(ctx context.Context, base *http.Transport, l *leaseclient.Lease, u *url.URL, timeout time.Duration) exitResult {
	r := exitResult{Proxy: l.Proxy.GetId(), EgressIP: l.Proxy.GetEgressIp()}
	t := base.Clone()
	t.Proxy = http.ProxyURL(l.ProxyURL())
	var connect faults.Class
	t.OnProxyConnectResponse = func(_ context.Context, _ *url.URL, _ *http.Request, resp *http.Response) error {
		if resp.StatusCode/100 != 2 {
			connect = faults.Connect(resp.StatusCode, resp.Header)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	start := time.Now()
	resp, err := (&http.Client{Transport: t, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
	r.LatencyMs = float64(time.Since(start).Microseconds()) / 1000
	if err != nil {
		var opErr interface{ Timeout() bool }
		switch {
		case connect != "":
			r.Verdict = string(faults.ResultOf(connect))
		case strings.Contains(err.Error(), "proxyconnect"):
			r.Verdict = string(faults.Error) // the proxy did not answer
		default:
			r.Verdict = string(faults.TargetError)
		}
		if r.Verdict == "" {
			r.Verdict = string(faults.TargetError)
		}
		if errors.As(err, &opErr) && opErr.Timeout() {
			r.Detail = "timed out: "
		}
		r.Detail += err.Error()
		return r
	}
	defer resp.Body.Close()
	head, _ := io.ReadAll(io.LimitReader(resp.Body, int64(faults.MarkerWindow())))
	r.Status = resp.StatusCode
	r.Verdict = string(faults.Response(resp.StatusCode, resp.Header, head))
	return r
}
