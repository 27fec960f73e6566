package gateway

import (
	"bytes"
	"io"
	"net/http"
	"regexp"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

// markerWindow is how much of a body is searched for block markers: the
// clients' default policy's (docs/api.md, "Outcomes").
const markerWindow = 64 << 10

// blockMarkers are the words of block and captcha pages, the same list
// as the Python and Node clients' default policy.
var blockMarkers = regexp.MustCompile(`captcha|g-recaptcha|h-captcha|cf-chl-|challenge-platform|access denied|are you a robot|unusual traffic|request blocked|you have been blocked|bot detection`)

// classify is the clients' default ban policy (docs/api.md, "Outcomes")
// for a plain HTTP answer that came through the leased proxy: its
// status, headers and the first markerWindow bytes of its body.
func classify(status int, h http.Header, head []byte) store.Outcome {
	switch {
	case h.Get("X-Squid-Error") != "":
		return store.Failed
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable && h.Get("Retry-After") != "":
		return store.RateLimited
	case status == http.StatusForbidden:
		return store.Blocked
	case blockMarkers.Match(bytes.ToLower(head)):
		return store.Blocked
	}
	return store.OK
}

// sniffer passes a body through and keeps its first markerWindow bytes.
type sniffer struct {
	body io.ReadCloser
	head []byte
}

func (s *sniffer) Read(p []byte) (int, error) {
	n, err := s.body.Read(p)
	if room := markerWindow - len(s.head); room > 0 {
		s.head = append(s.head, p[:min(n, room)]...)
	}
	return n, err
}

func (s *sniffer) Close() error { return s.body.Close() }
