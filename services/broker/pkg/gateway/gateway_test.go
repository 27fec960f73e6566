package gateway

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/egress-proxies/egress-proxies/services/broker/pkg/store"
)

func TestParseUser(t *testing.T) {
	cases := map[string]struct {
		user string
		want userOptions
		err  string
	}{
		"empty":          {"", userOptions{}, ""},
		"all options":    {"namespace=crawl,session=s-1,attr.pool=eu,attr.tier=a.b-c", userOptions{namespace: "crawl", session: "s-1", selector: map[string]string{"pool": "eu", "tier": "a.b-c"}}, ""},
		"unknown":        {"country=us", userOptions{}, `option "country" is unknown`},
		"twice":          {"session=a,session=b", userOptions{}, `"session" is given twice`},
		"no value":       {"session=", userOptions{}, "empty value"},
		"not a pair":     {"crawl", userOptions{}, `"crawl" is not name=value`},
		"bare prefix":    {"attr.=x", userOptions{}, `"attr." is unknown`},
		"trailing comma": {"session=a,", userOptions{}, `"" is not name=value`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := parseUser(tc.user)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// The table of docs/api.md, "Outcomes", as the clients' suites hold them
// to it.
func TestClassify(t *testing.T) {
	cases := []struct {
		name   string
		status int
		header http.Header
		body   string
		want   store.Outcome
	}{
		{"squid error page", 503, http.Header{"X-Squid-Error": {"ERR_CONNECT_FAIL 111"}}, "", store.Failed},
		{"429", 429, nil, "", store.RateLimited},
		{"503 with Retry-After", 503, http.Header{"Retry-After": {"30"}}, "", store.RateLimited},
		{"503 without", 503, nil, "", store.OK},
		{"403", 403, nil, "", store.Blocked},
		{"captcha page", 200, nil, "<div class=\"g-recaptcha\">", store.Blocked},
		{"marker in capitals", 200, nil, "Access Denied", store.Blocked},
		{"marker past the window", 200, nil, strings.Repeat("x", markerWindow) + "captcha", store.OK},
		{"404", 404, nil, "not found", store.OK},
		{"200", 200, nil, "hello", store.OK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.header
			if h == nil {
				h = http.Header{}
			}
			s := &sniffer{body: io.NopCloser(strings.NewReader(tc.body))}
			_, _ = readAll(s)
			assert.Equal(t, tc.want, classify(tc.status, h, s.head))
		})
	}
}

func readAll(s *sniffer) (int, error) {
	n, buf := 0, make([]byte, 1000)
	for {
		m, err := s.Read(buf)
		n += m
		if err != nil {
			return n, err
		}
	}
}

func TestRefusal(t *testing.T) {
	refused := func(code codes.Code, reason string, wait time.Duration) error {
		st := status.New(code, "no proxy available: why")
		st, _ = st.WithDetails(&errdetails.ErrorInfo{Reason: reason}, &errdetails.RetryInfo{RetryDelay: durationpb.New(wait)})
		return st.Err()
	}
	cases := []struct {
		name  string
		err   error
		code  int
		retry time.Duration
	}{
		{"no proxy qualifies", refused(codes.ResourceExhausted, "ALL_COOLING_DOWN", 90*time.Second), 503, 90 * time.Second},
		{"paced", refused(codes.ResourceExhausted, "TARGET_PACED", 1500*time.Millisecond), 429, 1500 * time.Millisecond},
		{"token cap", refused(codes.ResourceExhausted, "TOKEN_LEASE_CAP", time.Second), 429, time.Second},
		{"bad selector", status.Error(codes.InvalidArgument, "selector.pool: must be at most 63 characters"), 400, 0},
		{"unauthenticated", status.Error(codes.Unauthenticated, "invalid bearer token"), 407, 0},
		{"store down", status.Error(codes.Unavailable, "lease store unavailable"), 503, time.Second},
		{"anything else", errors.New("boom at 10.0.0.7:6379"), 502, time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := refusal(tc.err)
			assert.Equal(t, tc.code, a.code)
			assert.Equal(t, tc.retry, a.retryAfter)
			assert.NotContains(t, a.msg, "10.0.0.7", "an internal error's text stays inside")
		})
	}
}
