// Package promtext reads metrics in tests: a process's /metrics from the
// outside, as the end-to-end tests and benchmarks do (Prometheus' text
// exposition, one sample a line), or one series from a registry in
// process.
package promtext

import (
	"bufio"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Samples maps a series, "name{labels}" as exposed, to its value.
type Samples map[string]float64

// Scrape GETs url with c (nil means http.DefaultClient) and parses it.
func Scrape(c *http.Client, url string) (Samples, error) {
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	out := Samples{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// Sum adds the samples whose series starts with prefix: "name{" sums
// every series of name.
func (s Samples) Sum(prefix string) float64 {
	total := 0.0
	for k, v := range s {
		if strings.HasPrefix(k, prefix) {
			total += v
		}
	}
	return total
}

// Gathered is the value of the series of name whose label is value, read
// in process from g (a registry a test shares with the code under test);
// 0 when there is none. Counters and gauges alike.
func Gathered(g prometheus.Gatherer, name, label, value string) (float64, error) {
	families, err := g.Gather()
	if err != nil {
		return 0, err
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					if gauge := m.GetGauge(); gauge != nil {
						return gauge.GetValue(), nil
					}
					return m.GetCounter().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}
