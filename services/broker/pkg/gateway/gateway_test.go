package gateway

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/egress-proxies/egress-proxies/pkg/faults"
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
		// The vendors' grammars, read as aliases.
		"bright data":         {"brd-customer-c1-zone-resi-country-us-session-abc", userOptions{session: "abc", selector: map[string]string{"country": "us"}}, ""},
		"bright data, any":    {"brd-customer-c1-zone-resi", userOptions{}, ""},
		"oxylabs":             {"customer-acme-cc-DE-sessid-x9-sesstime-10", userOptions{session: "x9", selector: map[string]string{"country": "de"}}, ""},
		"decodo":              {"user-u1-country-fr-session-s2-sessionduration-30", userOptions{session: "s2", selector: map[string]string{"country": "fr"}}, ""},
		"apify":               {"groups-RESIDENTIAL,session-a7,country-GB", userOptions{session: "a7", selector: map[string]string{"country": "gb"}}, ""},
		"vendor option":       {"brd-customer-c1-zone-resi-city-paris-session-a", userOptions{}, `BrightData user name option "city" is unknown`},
		"vendor missing part": {"brd-customer-c1-session-a", userOptions{}, `lacks option "zone"`},
		"vendor bad country":  {"customer-acme-cc-USA-sessid-1", userOptions{}, "not a two-letter country code"},
		"ours wins on =":      {"session=customer-x", userOptions{session: "customer-x"}, ""},
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

// The sniffer passes a body through unchanged and keeps what the fault
// table searches for markers, no more.
func TestSnifferKeepsTheMarkerWindow(t *testing.T) {
	for _, size := range []int{0, 10, faults.MarkerWindow(), 3 * faults.MarkerWindow()} {
		body := strings.Repeat("y", size)
		s := &sniffer{body: io.NopCloser(strings.NewReader(body))}
		n, err := readAll(s)
		assert.ErrorIs(t, err, io.EOF)
		assert.Equal(t, size, n)
		assert.Len(t, s.head, min(size, faults.MarkerWindow()))
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
		name      string
		err       error
		code      int
		retry     time.Duration
		fault     faults.Class
		retryable bool
	}{
		{"no proxy qualifies", refused(codes.ResourceExhausted, "ALL_COOLING_DOWN", 90*time.Second), 503, 90 * time.Second, faults.Capacity, true},
		{"paced", refused(codes.ResourceExhausted, "TARGET_PACED", 1500*time.Millisecond), 429, 1500 * time.Millisecond, faults.Capacity, true},
		{"token cap", refused(codes.ResourceExhausted, "TOKEN_LEASE_CAP", time.Second), 429, time.Second, faults.Capacity, true},
		{"bad selector", status.Error(codes.InvalidArgument, "selector.pool: must be at most 63 characters"), 400, 0, faults.Caller, false},
		{"unauthenticated", status.Error(codes.Unauthenticated, "invalid bearer token"), 407, 0, faults.Caller, false},
		{"store down", status.Error(codes.Unavailable, "lease store unavailable"), 503, time.Second, faults.Capacity, true},
		{"anything else", errors.New("boom at 10.0.0.7:6379"), 502, time.Second, faults.Capacity, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := refusal(tc.err)
			assert.Equal(t, tc.code, a.code)
			assert.Equal(t, tc.retry, a.retryAfter)
			assert.Equal(t, tc.fault, a.fault)
			assert.Equal(t, tc.retryable, a.retry)
			assert.NotContains(t, a.msg, "10.0.0.7", "an internal error's text stays inside")
		})
	}
}

// docs/api/gateway.md publishes the gateway's refusals as a stable table: each
// reason's status, fault and retryable there are the ones it answers with.
func TestRefusalTableIsPublished(t *testing.T) {
	doc, err := os.ReadFile("../../../../docs/api/gateway.md")
	require.NoError(t, err)
	rows := map[string]string{}
	for _, line := range strings.Split(string(doc), "\n") {
		for reason := range verdicts {
			if strings.HasPrefix(line, "| ") && strings.Contains(line, "`"+reason+"`") {
				rows[reason] = line
			}
		}
	}
	for reason, v := range verdicts {
		row, ok := rows[reason]
		if !assert.True(t, ok, "docs/api/gateway.md has no row for %s", reason) {
			continue
		}
		assert.Contains(t, row, strconv.Itoa(v.code), "%s's status", reason)
		assert.Contains(t, row, fmt.Sprintf("| %s | %t |", v.fault, v.retry), "%s's fault and retryable", reason)
	}
}

// A CONNECT tries a name's addresses families alternating from the first,
// at most maxAddrs of them.
func TestTryOrderAlternatesFamilies(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"192.0.2.1", "192.0.2.1"},
		{"2001:db8::1 2001:db8::2 192.0.2.1", "2001:db8::1 192.0.2.1 2001:db8::2"},
		{"192.0.2.1 192.0.2.2 192.0.2.3 192.0.2.4 192.0.2.5", "192.0.2.1 192.0.2.2 192.0.2.3 192.0.2.4"},
		{"2001:db8::1 192.0.2.1 192.0.2.2 192.0.2.3 2001:db8::2", "2001:db8::1 192.0.2.1 2001:db8::2 192.0.2.2"},
	} {
		r := &request{}
		for _, a := range strings.Fields(tc.in) {
			r.addrs = append(r.addrs, netip.MustParseAddr(a))
		}
		var got []string
		for _, a := range r.tryOrder() {
			got = append(got, a.String())
		}
		assert.Equal(t, tc.want, strings.Join(got, " "), tc.in)
	}
}
