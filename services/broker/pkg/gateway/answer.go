package gateway

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/leaseclient"
)

// answer is what the gateway says to a client itself, rather than
// passing on the target's answer: always plain text, naming what was
// wrong, and never an internal address or a stack.
type answer struct {
	code int
	// reason is the machine-readable why (X-Egress-Proxies-Reason), as the
	// lease API's ErrorInfo reason where there is one.
	reason string
	msg    string
	// retryAfter, when set, is sent as Retry-After in whole seconds.
	retryAfter time.Duration
	// header is added (Proxy-Authenticate).
	header http.Header
}

func (a answer) write(w io.Writer) error {
	body := a.msg + "\n"
	b := fmt.Appendf(nil, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n",
		a.code, http.StatusText(a.code), len(body))
	if a.reason != "" {
		b = fmt.Appendf(b, "X-Egress-Proxies-Reason: %s\r\n", a.reason)
	}
	if a.retryAfter > 0 {
		b = fmt.Appendf(b, "Retry-After: %d\r\n", max(int64(math.Ceil(a.retryAfter.Seconds())), 1))
	}
	for k, vs := range a.header {
		for _, v := range vs {
			b = fmt.Appendf(b, "%s: %s\r\n", k, v)
		}
	}
	b = append(append(b, "\r\n"...), body...)
	_, err := w.Write(b)
	return err
}

// needAuth is the 407 a client without valid credentials gets.
func needAuth(why string) answer {
	return answer{code: http.StatusProxyAuthRequired, reason: "PROXY_AUTH", msg: why + ": send the API token as the proxy password (http://<options>:<token>@<gateway>)",
		header: http.Header{"Proxy-Authenticate": {`Basic realm="egress-proxies"`}}}
}

// paced are the refusals about the target or the caller, which waiting
// cures: 429. Every other refusal says no proxy qualifies: 503.
var paced = map[string]bool{"TARGET_PACED": true, "TARGET_AT_CAP": true, "TOKEN_LEASE_CAP": true, "TOKEN_REPORT_RATE": true}

// refusal is the answer for a lease API error.
func refusal(err error) answer {
	st := status.Convert(err)
	a := answer{msg: st.Message()}
	a.reason, a.retryAfter = leaseclient.Details(st)
	switch st.Code() {
	case codes.Unauthenticated:
		return needAuth(st.Message())
	case codes.InvalidArgument, codes.AlreadyExists:
		a.code = http.StatusBadRequest
	case codes.ResourceExhausted:
		a.code = http.StatusServiceUnavailable
		if paced[a.reason] {
			a.code = http.StatusTooManyRequests
		}
	case codes.Unavailable:
		a.code, a.retryAfter = http.StatusServiceUnavailable, time.Second
	case codes.DeadlineExceeded, codes.Canceled:
		a.code, a.msg = http.StatusGatewayTimeout, "leasing a proxy took too long; retry"
	default:
		a.code, a.reason, a.msg, a.retryAfter = http.StatusBadGateway, "INTERNAL", "the gateway could not lease a proxy; retry", time.Second
	}
	return a
}
