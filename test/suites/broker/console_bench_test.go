package broker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// BenchmarkConsole (make bench-console): the console in Debian's headless
// Chromium against a real broker with CONSOLE_N proxies (10,000 unless
// set). Each figure against the REST calls it makes, in the same run:
//   - first full render: from the page's script starting to every proxy
//     in the table (the first screen painted, the count complete),
//     against the ListProxies page calls that fetch the same fleet from
//     Go;
//   - live update: from a Proxy's status write to its row showing it,
//     against the same event reaching a Go client of the REST watch.
func BenchmarkConsole(b *testing.B) {
	n := 10000
	if v := os.Getenv("CONSOLE_N"); v != "" {
		var err error
		n, err = strconv.Atoi(v)
		require.NoError(b, err)
	}
	nsObj := env.Namespace(b, "bench-console")
	which := make([]int, n)
	for i := range which {
		which[i] = i
	}
	start := time.Now()
	require.NoError(b, createReady(nsObj, which, func(i int) (string, string, map[string]string) {
		return fmt.Sprintf("p%05d", i), fmt.Sprintf("127.%d.%d.%d", 20+i/62500, i/250%250, i%250+1), map[string]string{"geo": []string{"eu", "us", "ap"}[i%3]}
	}))
	fmt.Printf("bench-console: %d proxies written in %s\n", n, time.Since(start).Round(time.Second))

	kc, err := env.WriteKubeconfig(b.TempDir())
	require.NoError(b, err)
	tokens := filepath.Join(b.TempDir(), "tokens")
	require.NoError(b, os.WriteFile(tokens, []byte("ops:bench-secret\n"), 0o600))
	r := proc.StartRedis(b, false)
	ops, g, h := proc.FreePort(b), proc.FreePort(b), proc.FreePort(b)
	restURL := "http://" + proc.Addr(h)
	p := proc.Start(b, "broker", proc.Build(b, pkgPath), "--kubeconfig", kc, "--namespace", nsObj, "--redis-addrs", r.Addr,
		"--token-file", tokens, "--ops-addr", proc.Addr(ops), "--grpc-addr", proc.Addr(g), "--http-addr", proc.Addr(h))
	proc.WaitHTTP(b, p, "http://"+proc.Addr(ops)+"/readyz", 120*time.Second)
	auth := "Bearer bench-secret"

	// The baseline: the page calls, from Go.
	pages := func() (time.Duration, int) {
		t0 := time.Now()
		count, tok := 0, ""
		for {
			u := restURL + "/v1/proxies?pageSize=500"
			if tok != "" {
				u += "&pageToken=" + tok
			}
			req, _ := http.NewRequest("GET", u, nil)
			req.Header.Set("Authorization", auth)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(b, err)
			var body struct {
				Proxies       []struct{ ID string }
				NextPageToken string
			}
			err = json.NewDecoder(resp.Body).Decode(&body)
			_ = resp.Body.Close()
			require.NoError(b, err)
			count += len(body.Proxies)
			if body.NextPageToken == "" {
				return time.Since(t0), count
			}
			tok = body.NextPageToken
		}
	}
	require.Eventually(b, func() bool { _, c := pages(); return c == n }, 2*time.Minute, 200*time.Millisecond, "the broker lists every proxy")

	bctx := browser(b)
	// The token goes in as the login form stores it.
	require.NoError(b, chromedp.Do(bctx, chromedp.Navigate(restURL+"/console/"), chromedp.WaitVisible("#login")))
	_, err = chromedp.Run(bctx, chromedp.Evaluate[bool](`sessionStorage.setItem("egress-token", "bench-secret"), true`))
	require.NoError(b, err)

	const rounds = 5
	var base, render []float64
	for range rounds {
		d, _ := pages()
		base = append(base, float64(d.Microseconds())/1000)
		require.NoError(b, chromedp.Do(bctx, chromedp.Navigate(restURL+"/console/?"+strconv.FormatInt(time.Now().UnixNano(), 10))))
		until(b, bctx, time.Minute, "the whole fleet", fmt.Sprintf(`window.__console.firstRenderMs > 0 && document.querySelector(".count").textContent === "%d of %d proxies"`, n, n))
		ms, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`window.__console.firstRenderMs`))
		require.NoError(b, err)
		render = append(render, ms)
	}
	until(b, bctx, time.Minute, "the watch synced", `window.__console.synced`)

	// Live updates: the watch from Go and the row on screen, for the same
	// status writes to proxies in the first screen of rows.
	req, _ := http.NewRequest("GET", restURL+"/v1/proxies:watch", nil)
	req.Header.Set("Authorization", auth)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(b, err)
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(make([]byte, 1<<20), 64<<20)
	for lines.Scan() && !strings.Contains(lines.Text(), "TYPE_SYNCED") {
	}
	wf := &fleet{t: b, ns: nsObj}
	var watchMs, screenMs []float64
	for i := range 10 {
		name := fmt.Sprintf("p%05d", i)
		id := nsObj + "/" + name
		// The page notes, frame by frame, when the row first shows the
		// change, on the machine's clock (the test's, too).
		_, err := chromedp.Run(bctx, chromedp.Evaluate[bool](fmt.Sprintf(`window.__seen = 0; (function check() {
			if (document.querySelector('#fleet .row[data-id="%s"]')?.dataset.state === "unhealthy") window.__seen = performance.timeOrigin + performance.now();
			else requestAnimationFrame(check);
		})(), true`, id)))
		require.NoError(b, err)
		t0 := time.Now()
		wf.setHealthy(name, false)
		for lines.Scan() {
			if strings.Contains(lines.Text(), id) {
				break
			}
		}
		watchMs = append(watchMs, float64(time.Since(t0).Microseconds())/1000)
		until(b, bctx, 30*time.Second, name+" unhealthy", `window.__seen > 0`)
		seen, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`window.__seen`))
		require.NoError(b, err)
		screenMs = append(screenMs, seen-float64(t0.UnixMicro())/1000)
	}
	med := func(v []float64) float64 { s := append([]float64(nil), v...); sort.Float64s(s); return s[len(s)/2] }
	fmt.Printf("bench-console: %d proxies, median of %d loads and %d updates\n", n, rounds, len(screenMs))
	fmt.Printf("  %-44s %9.1f ms\n", "REST pages, Go client (baseline)", med(base))
	fmt.Printf("  %-44s %9.1f ms  %5.2fx\n", "console first full render", med(render), med(render)/med(base))
	fmt.Printf("  %-44s %9.1f ms\n", "status write to REST watch event (baseline)", med(watchMs))
	fmt.Printf("  %-44s %9.1f ms  %5.2fx\n", "status write to the row on screen", med(screenMs), med(screenMs)/med(watchMs))
	b.ReportMetric(med(render)/med(base), "render/pages")
	b.ReportMetric(med(screenMs)/med(watchMs), "screen/watch")
}
