package gateway

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
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
	// fault is whose fault it was (X-Egress-Proxies-Fault), and retry
	// whether the same request may succeed if sent again
	// (X-Egress-Proxies-Retryable).
	fault faults.Class
	retry bool
	msg   string
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
	if a.fault != "" {
		b = fmt.Appendf(b, "X-Egress-Proxies-Fault: %s\r\nX-Egress-Proxies-Retryable: %t\r\n", a.fault, a.retry)
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

// verdict is one of the gateway's own refusals: its status, whose fault
// it is, and whether the same request may succeed if sent again.
type verdict struct {
	code  int
	fault faults.Class
	retry bool
}

// verdicts are the gateway's own refusals, by reason: the table
// docs/api/clients.md publishes ("Whose fault"), stable across versions. The
// lease API's refusals are judged by refusal, from their gRPC code.
var verdicts = map[string]verdict{
	"PROXY_AUTH":         {http.StatusProxyAuthRequired, faults.Caller, false},
	"BAD_OPTIONS":        {http.StatusBadRequest, faults.Caller, false},
	"BAD_DESTINATION":    {http.StatusBadRequest, faults.Caller, false},
	"BAD_REQUEST":        {http.StatusBadRequest, faults.Caller, false},
	"HEAD_TOO_LARGE":     {http.StatusRequestHeaderFieldsTooLarge, faults.Caller, false},
	"HEAD_TIMEOUT":       {http.StatusRequestTimeout, faults.Caller, true},
	"EGRESS_DENIED":      {http.StatusForbidden, faults.Caller, false},
	"PROXY_DENIED":       {http.StatusForbidden, faults.Caller, false},
	"TOKEN_TUNNEL_CAP":   {http.StatusTooManyRequests, faults.Capacity, true},
	"TENANT_BYTES_QUOTA": {http.StatusTooManyRequests, faults.Caller, true},
	"GATEWAY_BUSY":       {http.StatusServiceUnavailable, faults.Capacity, true},
	"SOURCE_CONN_CAP":    {http.StatusTooManyRequests, faults.Capacity, true},
	"UNRESOLVED":         {http.StatusBadGateway, faults.Site, false},
	"SITE_UNREACHABLE":   {http.StatusBadGateway, faults.Site, false},
	"SITE_TIMEOUT":       {http.StatusGatewayTimeout, faults.Site, true},
	"SITE_FAILED":        {http.StatusBadGateway, faults.Site, true},
	"SITE_BLOCKED":       {http.StatusForbidden, faults.Ban, true},
	"SITE_RATE_LIMITED":  {http.StatusTooManyRequests, faults.Ban, true},
	"PROXY_UNREACHABLE":  {http.StatusBadGateway, faults.Proxy, true},
	"PROXY_FAILED":       {http.StatusBadGateway, faults.Proxy, true},
}

// deny is the gateway's own refusal for reason, as verdicts has it.
func deny(reason, msg string) answer {
	v, ok := verdicts[reason]
	if !ok {
		panic("gateway: no verdict for " + reason)
	}
	return answer{code: v.code, reason: reason, fault: v.fault, retry: v.retry, msg: msg}
}

// needAuth is the 407 a client without valid credentials gets.
func needAuth(why string) answer {
	a := deny("PROXY_AUTH", why+": send the API token as the proxy password (http://<options>:<token>@<gateway>)")
	a.header = http.Header{"Proxy-Authenticate": {`Basic realm="egress-proxies"`}}
	return a
}

// paced are the refusals about the target or the caller, which waiting
// cures: 429. Every other refusal says no proxy qualifies: 503.
var paced = map[string]bool{"TARGET_PACED": true, "TARGET_AT_CAP": true, "TOKEN_LEASE_CAP": true, "TOKEN_REPORT_RATE": true,
	"TENANT_LEASE_RATE": true, "TENANT_SELECTOR_BUDGET": true}

// refusal is the answer for a lease API error.
func refusal(err error) answer {
	st := status.Convert(err)
	// A refusal for want of a proxy, a pace or a cap passes; the caller's
	// own mistakes do not.
	a := answer{msg: st.Message(), fault: faults.Capacity, retry: true}
	a.reason, a.retryAfter = leaseclient.Details(st)
	switch st.Code() {
	case codes.Unauthenticated:
		return needAuth(st.Message())
	case codes.InvalidArgument, codes.AlreadyExists:
		a.code, a.fault, a.retry = http.StatusBadRequest, faults.Caller, false
	case codes.PermissionDenied:
		// Outside the tenant: its verbs, namespaces or selector.
		a.code, a.fault, a.retry = http.StatusForbidden, faults.Caller, false
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

func withRetryAfter(a answer, d time.Duration) answer {
	a.retryAfter = d
	return a
}
