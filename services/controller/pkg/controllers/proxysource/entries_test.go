package proxysource

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/netpolicy"
	"github.com/egress-proxies/egress-proxies/pkg/testutil/proc"
)

func mustParse(t *testing.T, body string, format v1.SourceFormat, r rules) parsed {
	t.Helper()
	p, err := parse(strings.NewReader(body), format, r)
	require.NoError(t, err)
	return p
}

func TestParseLinesAndJSON(t *testing.T) {
	p := mustParse(t, "a.example:1\n[fd00::1]:2:u:p:with:colons\nb.example:3:u\n", v1.FormatLines, rules{})
	assert.Equal(t, []string{"[fd00::1]:2 u", "a.example:1"}, sortedKeys(p.entries))
	assert.Equal(t, "p:with:colons", p.entries["[fd00::1]:2 u"].Password, "a password may hold colons")
	assert.Equal(t, []string{"line 3: credentials must be user:pass"}, p.rejected)

	p = mustParse(t, "# comment\r\n\r\nc.example:4\r\nd.example:5", v1.FormatLines, rules{})
	assert.Equal(t, []string{"c.example:4", "d.example:5"}, sortedKeys(p.entries), "CRLF, comments and no final newline")

	p = mustParse(t, `[{"host":"h","port":1,"attributes":{"bad key!":"x"}},{"host":"g","port":2,"extra":1}]`, v1.FormatJSON, rules{})
	assert.Empty(t, p.entries, "an unknown field makes the whole array garbage")
	require.Len(t, p.rejected, 1)
	assert.Contains(t, p.rejected[0], `unknown field "extra"`)

	p = mustParse(t, `[{"host":"h","port":1,"attributes":{"bad key!":"x"}},{"host":"g","port":2}]`, v1.FormatJSON, rules{})
	assert.Equal(t, []string{"g:2"}, sortedKeys(p.entries))
	assert.Equal(t, []string{`entry 0: attribute name "bad key!" is not 1-63 letters, digits, '-', '_' or '.'`}, p.rejected)

	for _, garbage := range []string{`{"host":"h","port":1}`, `[{"host":"h","port":1}`, `[{"host":"h","port":1}] [1]`, `<html>`} {
		p = mustParse(t, garbage, v1.FormatJSON, rules{})
		assert.Empty(t, p.entries, garbage)
		assert.Equal(t, 1, p.Rejected(), garbage)
	}
}

// What bounds a read is the cap and one line, never the body: entries
// past spec.maxEntries are counted and not read, a line past maxLine is
// rejected and the next one read, and addresses in the proxy-address
// policy are rejected naming it.
func TestParseIsBounded(t *testing.T) {
	cases := []struct {
		name     string
		body     string
		format   v1.SourceFormat
		rules    rules
		want     []string
		over     int
		rejected []string
	}{
		{name: "lines past the cap are counted, not read", body: "a:1\na:1\nb:1\nc:1\nnot a line\n", rules: rules{limit: 2},
			want: []string{"a:1", "b:1"}, over: 2, rejected: []string{"line 2: a:1 is listed twice"}},
		{name: "JSON past the cap is counted", body: `[{"host":"a","port":1},{"host":"b","port":1},{"host":"c","port":1}]`, format: v1.FormatJSON, rules: rules{limit: 1},
			want: []string{"a:1"}, over: 2},
		{name: "a long line is rejected, the next read", body: "a:1\n" + strings.Repeat("x", 3*maxLine) + "\nb:1\n",
			want: []string{"a:1", "b:1"}, rejected: []string{fmt.Sprintf("line 2: longer than %d bytes", maxLine)}},
		{name: "the proxy-address policy holds entries",
			body:  "169.254.169.254:80\n[fe80::1]:3128\n10.0.0.1:3128\nmetadata.example:80\n",
			rules: rules{deny: netpolicy.DenyList{netip.MustParsePrefix("169.254.0.0/16"), netip.MustParsePrefix("fe80::/10")}},
			want:  []string{"10.0.0.1:3128", "metadata.example:80"},
			rejected: []string{"line 1: 169.254.169.254 is in the proxy-address deny list (169.254.0.0/16)",
				"line 2: fe80::1 is in the proxy-address deny list (fe80::/10)"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := mustParse(t, c.body, formatOr(c.format), c.rules)
			assert.Equal(t, c.want, sortedKeys(p.entries))
			assert.Equal(t, c.over, p.over)
			assert.Equal(t, c.rejected, p.rejected)
		})
	}
}

// A body over spec.url.maxBytes is refused whole, wherever it is cut.
func TestCappedRefusesABodyOverItsLimit(t *testing.T) {
	for _, size := range []int{99, 100, 101, 4096} {
		_, err := io.Copy(io.Discard, &capped{r: strings.NewReader(strings.Repeat("x", size)), left: 100})
		if size > 100 {
			assert.ErrorIs(t, err, errOverMaxBytes, "%d bytes", size)
		} else {
			assert.NoError(t, err, "%d bytes", size)
		}
	}
}

// rssChild, when set, is the list URL a child process of
// TestA64MiBListFitsUnderTheControllersMemoryLimit fetches and parses.
const rssChild = "PROXYSOURCE_RSS_CHILD_URL"

// chartMemoryLimit is the controller's memory limit in the chart.
const chartMemoryLimit = 512 << 20

// A 64 MiB list (the most spec.url.maxBytes allows) of distinct valid
// lines, fetched over HTTP and parsed in a process of its own: its peak
// RSS stays far under the chart's limit (it was about 1 GiB when the body
// was read whole and split), and the cap keeps 10,000 entries.
func TestA64MiBListFitsUnderTheControllersMemoryLimit(t *testing.T) {
	if u := os.Getenv(rssChild); u != "" {
		r := reader{egress: proc.SuiteEgress()}
		// The longest timeout the CRD allows: this measures memory, under
		// the race detector too, not speed.
		p, err := r.fetch(t.Context(), "ns", &v1.SourceURL{URL: u, MaxBytes: new(int64(64 << 20)), Timeout: &metav1.Duration{Duration: time.Minute}}, rules{limit: DefaultMaxEntries})
		require.NoError(t, err)
		fmt.Printf("entries=%d over=%d rejected=%d\n", len(p.entries), p.over, p.Rejected())
		fmt.Printf("peak=%d\n", peakRSS(t))
		return
	}
	if testing.Short() {
		t.Skip("starts a process")
	}
	const size = 64 << 20
	var lines atomic.Int64
	srv := proc.Serve(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		bw := bufio.NewWriterSize(w, 64<<10)
		n, i := 0, 0
		for ; ; i++ {
			line := fmt.Sprintf("h%d.lists.example:8080\n", i)
			if n+len(line) > size {
				break
			}
			n += len(line)
			_, _ = bw.WriteString(line)
		}
		pad := size - n // comment lines make up the rest
		_, _ = bw.WriteString("#" + strings.Repeat("#", pad-2) + "\n")
		_ = bw.Flush()
		lines.Store(int64(i))
	}), false)
	cmd := exec.Command(os.Args[0], "-test.run=^TestA64MiBListFitsUnderTheControllersMemoryLimit$", "-test.v")
	cmd.Env = append(os.Environ(), rssChild+"="+srv.URL+"/list")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var entries, over, rejected int
	var peak int64
	for _, l := range strings.Split(string(out), "\n") {
		_, _ = fmt.Sscanf(l, "entries=%d over=%d rejected=%d", &entries, &over, &rejected)
		_, _ = fmt.Sscanf(l, "peak=%d", &peak)
	}
	require.NotZero(t, peak, "%s", out)
	t.Logf("a 64 MiB list of %d lines: peak RSS %.1f MiB (the chart's limit is %d MiB)", lines.Load(), float64(peak)/(1<<20), chartMemoryLimit>>20)
	assert.Equal(t, DefaultMaxEntries, entries)
	assert.EqualValues(t, lines.Load()-DefaultMaxEntries, over)
	bound := int64(chartMemoryLimit / 4) // about 50 MiB measured, against ~1 GiB when read whole
	if raceEnabled {
		bound *= 2 // about 100 MiB measured under the race detector
	}
	assert.Less(t, peak, bound, "peak RSS of a 64 MiB list, in bytes")
}

// peakRSS is this process's high-water resident set, in bytes.
func peakRSS(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}
