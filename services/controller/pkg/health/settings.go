package health

import (
	"fmt"
	"net/url"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	probev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/probe/v1"
	"github.com/egress-proxies/egress-proxies/pkg/probespec"
)

// Defaults are the controller-wide probe settings; spec.healthCheck
// overrides any of them per Proxy.
type Defaults struct {
	URL              string
	ExpectedStatus   int
	Interval         time.Duration
	Timeout          time.Duration
	FailureThreshold int
	SuccessThreshold int
	// EchoFormat (see probespec) applies to every Proxy.
	EchoFormat string
	// Trace asks probers to trace every probe (high volume).
	Trace bool
}

// DefaultDefaults: a real deployment probes the internet; every test and
// the demo override URL with a local HTTPS target.
var DefaultDefaults = Defaults{
	URL: "https://www.gstatic.com/generate_204", ExpectedStatus: 204,
	Interval: probespec.DefaultInterval, Timeout: probespec.DefaultTimeout, FailureThreshold: 3, SuccessThreshold: 2,
}

// Validate names the first bad setting.
func (d Defaults) Validate() error {
	u, err := url.Parse(d.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("--health-url %q must be an absolute http or https URL", d.URL)
	case d.ExpectedStatus < 100 || d.ExpectedStatus > 599:
		return fmt.Errorf("--health-expected-status %d must be an HTTP status", d.ExpectedStatus)
	case d.Interval <= 0 || d.Timeout <= 0:
		return fmt.Errorf("--health-interval and --health-timeout must be positive")
	case d.Timeout >= d.Interval:
		return fmt.Errorf("--health-timeout %s must be less than --health-interval %s: one probe of a proxy runs at a time", d.Timeout, d.Interval)
	case d.FailureThreshold < 1 || d.SuccessThreshold < 1:
		return fmt.Errorf("--health-failure-threshold and --health-success-threshold must be at least 1")
	}
	if err := probespec.ValidateEchoFormat(d.EchoFormat); err != nil {
		return fmt.Errorf("--health-echo-format: %w", err)
	}
	return nil
}

// Settings is the effective settings of one Proxy.
type Settings struct {
	Defaults
}

func (d Defaults) Resolve(hc *v1.HealthCheck) Settings {
	r := Settings{d}
	if hc == nil {
		return r
	}
	if hc.URL != "" {
		r.URL = hc.URL
	}
	if hc.ExpectedStatus != 0 {
		r.ExpectedStatus = int(hc.ExpectedStatus)
	}
	if hc.IntervalSeconds != 0 {
		r.Interval = time.Duration(hc.IntervalSeconds) * time.Second
	}
	if hc.TimeoutSeconds != 0 {
		r.Timeout = time.Duration(hc.TimeoutSeconds) * time.Second
	}
	if hc.FailureThreshold != 0 {
		r.FailureThreshold = int(hc.FailureThreshold)
	}
	if hc.SuccessThreshold != 0 {
		r.SuccessThreshold = int(hc.SuccessThreshold)
	}
	// The API refuses a timeout at or above the interval when both are
	// set; one set against the other's default is cut here.
	r.Timeout = min(r.Timeout, r.Interval)
	return r
}

func (r Settings) Proto() *probev1.ProbeSettings {
	return &probev1.ProbeSettings{
		Url: r.URL, ExpectedStatus: int32(r.ExpectedStatus), Interval: durationpb.New(r.Interval),
		Timeout: durationpb.New(r.Timeout), EchoFormat: r.EchoFormat, Trace: r.Trace,
	}
}
