package broker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"

	"github.com/egress-proxies/egress-proxies/pkg/testenv"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

// chromium is Debian's Chromium, which make deps installs.
func chromium(t testing.TB) string {
	path, err := exec.LookPath("chromium")
	require.NoError(t, err, "the console's suite drives Debian's chromium: make deps installs it")
	return path
}

// browser starts a headless Chromium of its own (a fresh profile, no
// background traffic: this machine reaches nothing outside) and returns
// a context that drives one tab of it.
func browser(t testing.TB) context.Context {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 860),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-features", "Translate,OptimizationHints,MediaRouter"),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	return ctx
}

// until evaluates expr in the page until it is true.
func until(t testing.TB, ctx context.Context, timeout time.Duration, what, expr string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		var ok bool
		if ok, err = chromedp.Run(ctx, chromedp.Evaluate[bool](expr)); err == nil && ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	seen, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.stringify(window.__console) + " " + document.body.innerText.slice(0, 400)`))
	t.Fatalf("the console never showed %s (%s): %v; it showed: %s", what, expr, err, seen)
}

// screenshot writes the page to docs/images/<name>.png when
// CONSOLE_SCREENSHOTS is set: the docs' pictures are this test's.
func screenshot(t *testing.T, ctx context.Context, name string) {
	if os.Getenv("CONSOLE_SCREENSHOTS") == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(testenv.RepoRoot(), "docs", "images", name+".png"), png, 0o644))
}

// The console, in a real browser against a real broker: it asks for the
// token the broker wants, lists the fleet, turns a row unhealthy when the
// watch says so, shows a target's cooldowns and a proxy's story with the
// command that acts on it, and changes nothing itself.
func TestConsoleInARealBrowser(t *testing.T) {
	f := newFleet(t)
	const n = 240
	for i := range n {
		name := fmt.Sprintf("p-%03d", i)
		f.addBehind(name, fmt.Sprintf("127.0.1.%d", i+1), fmt.Sprintf("198.51.100.%d", i+1))
	}
	tokens := filepath.Join(t.TempDir(), "tokens")
	require.NoError(t, os.WriteFile(tokens, []byte("ops:console-secret\n"), 0o600))
	b := startBroker(t, f, proc.StartRedis(t, false), "--token-file", tokens)
	auth := []string{"Authorization", "Bearer console-secret"}
	require.Eventually(t, func() bool {
		r := b.Do("GET", "/v1/proxies?pageSize=500", "", auth...)
		ps, _ := r.JSON["proxies"].([]any)
		return len(ps) == n
	}, 30*time.Second, 50*time.Millisecond)

	ctx := browser(t)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.REST+"/console/"), chromedp.WaitVisible("#login")))
	require.NoError(t, chromedp.Do(ctx, chromedp.SendKeys("#token", "console-secret"), chromedp.Click("#login button")))
	until(t, ctx, 30*time.Second, "the whole fleet, live", fmt.Sprintf(`window.__console.synced && document.querySelector(".count").textContent === "%d of %d proxies"`, n, n))
	until(t, ctx, 15*time.Second, "rows in view", `[...document.querySelectorAll("#fleet .rows .row")].filter(r => r.getBoundingClientRect().top < innerHeight).length > 10`)

	// The watch turns p-003's row unhealthy, and p-005's cordoned.
	id := f.ns + "/p-003"
	f.setHealthy("p-003", false)
	until(t, ctx, 15*time.Second, "p-003 unhealthy", fmt.Sprintf(`document.querySelector('#fleet .row[data-id="%s"]')?.dataset.state === "unhealthy"`, id))
	var px v1.Proxy
	require.NoError(t, env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: "p-005"}, &px))
	px.Annotations = map[string]string{v1.AnnotationCordoned: "true"}
	require.NoError(t, env.Client.Update(context.Background(), &px))
	until(t, ctx, 15*time.Second, "p-005 cordoned", fmt.Sprintf(`document.querySelector('#fleet .row[data-id="%s/p-005"]')?.dataset.state === "cordoned"`, f.ns))
	screenshot(t, ctx, "console-fleet")

	// A filter by state.
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(`select[aria-label="state"]`, "unhealthy")))
	_, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('select[aria-label="state"]').dispatchEvent(new Event("change"))`))
	require.NoError(t, err)
	until(t, ctx, 15*time.Second, "one unhealthy proxy", fmt.Sprintf(`document.querySelector(".count").textContent === "1 of %d proxies"`, n))

	// Rate-limited reports: the target page shows the exits cooling.
	report := func() string {
		l := b.Do("POST", "/v1/leases", `{"target":"shop.example"}`, auth...)
		require.Equal(t, 200, l.Status, string(l.Body))
		rep := b.Do("POST", "/v1/leases/"+l.JSON["leaseID"].(string)+"/report", `{"result":"rate_limited","statusCode":429}`, auth...)
		require.Equal(t, 200, rep.Status, string(rep.Body))
		return l.JSON["proxy"].(map[string]any)["id"].(string)
	}
	leased := report()
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.REST+"/console/#/target/shop.example")))
	until(t, ctx, 15*time.Second, "the cooling exit on the heatmap", `document.querySelectorAll(".heatmap .cell.l0").length >= 1`)
	if os.Getenv("CONSOLE_SCREENSHOTS") != "" {
		// A picture worth having: more exits pushed away, over a few polls.
		for range 3 {
			report()
			time.Sleep(5 * time.Second)
		}
		until(t, ctx, 15*time.Second, "four exits", `document.querySelectorAll(".heatmap a.label").length === 4`)
	}
	page, err := chromedp.Run(ctx, chromedp.Text("#view"))
	require.NoError(t, err)
	require.Contains(t, page, leased, "the heatmap names the cooling proxy")
	require.Contains(t, page, "kubectl egress bans --target shop.example")
	screenshot(t, ctx, "console-target")

	// The proxy's story, with the commands that act on it.
	ns, name, _ := strings.Cut(leased, "/")
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.REST+"/console/#/proxy/"+leased)))
	until(t, ctx, 10*time.Second, "the proxy's cooldowns", `[...document.querySelectorAll("#view td a")].some(a => a.textContent === "shop.example")`)
	page, err = chromedp.Run(ctx, chromedp.Text("#view"))
	require.NoError(t, err)
	require.Contains(t, page, "kubectl egress cordon "+name+" -n "+ns)

	// Leases by tenant, and sessions.
	l := b.Do("POST", "/v1/leases", `{"target":"shop.example","sessionKey":"cart-1"}`, auth...)
	require.Equal(t, 200, l.Status, string(l.Body))
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(b.REST+"/console/#/leases")))
	until(t, ctx, 10*time.Second, "the session", `document.querySelector("#view").innerText.includes("cart-1")`)
	page, err = chromedp.Run(ctx, chromedp.Text("#view"))
	require.NoError(t, err)
	require.Contains(t, page, "ops", "the leases' tenant")

	// The page changed nothing: the leases are the test's.
	ls := b.Do("GET", "/v1/leases", "", auth...)
	for _, l := range ls.JSON["leases"].([]any) {
		require.Equal(t, "shop.example", l.(map[string]any)["target"])
	}
}
