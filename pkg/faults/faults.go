// Package faults is the one answer to "whose fault is it?" for a request
// that went through a leased proxy: the proxy's, the site's, a ban, the
// caller's, or capacity. The ban-aware fleet remembers how each site
// treated each exit, so that memory is only as good as this attribution:
// a dead or hostile site must never count against a proxy.
//
// The rules are data (table.json, embedded): the block markers, how a
// proxy's answer to CONNECT and a site's answer map to a class, and the
// cases every client's policy is held to. The gateway classifies with
// this package; the Python and Node clients' suites run the same cases
// against their own policies and fail when they differ.
//
// A proxy is blamed only for what happens on its own hop: it did not
// accept the connection or answer, it refused our credentials (a 407
// with its challenge, which a proxy never passes on from a site), or it
// answered CONNECT with an error of its own. A CONNECT's answer comes from
// the proxy by construction (a site never sees the CONNECT), so there the
// Squid error code it carries (X-Squid-Error) says whose fault it was. A
// plain-HTTP answer may come from the site, which can send any header or
// page it likes, so there the code is never trusted: a site's answer is
// judged by its status and body alone, and the worst a forged Squid page
// can earn is the site's own fault.
package faults

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
)

// Class is whose fault a failure was.
type Class string

// Classes.
const (
	// Proxy: the proxy did not answer, refused our credentials, or failed
	// itself. Reported as Error: it counts toward the proxy's quarantine,
	// and the gateway tries another proxy.
	Proxy Class = "proxy"
	// Site: the target refused, reset, timed out, did not resolve, failed
	// TLS, or answered 5xx without a ban marker. Reported as TargetError,
	// which never counts against the proxy.
	Site Class = "site"
	// Ban: the target rate-limited or blocked the proxy's exit
	// (RateLimited, Blocked): it cools the exit down for the target.
	Ban Class = "ban"
	// Caller: bad options, a policy denial, a cancellation, the caller's
	// own exception. Nothing is reported.
	Caller Class = "caller"
	// Capacity: no proxy qualifies now (none matches, all cool down, caps,
	// pacing). There is no lease to report on.
	Capacity Class = "capacity"
)

// Result is a report's result (ReportLeaseRequest.result).
type Result string

// Results a report may give.
const (
	OK          Result = "ok"
	RateLimited Result = "rate_limited"
	Blocked     Result = "blocked"
	// Error is the proxy's own failure.
	Error Result = "error"
	// TargetError is the site's failure through a working proxy.
	TargetError Result = "target_error"
)

// Results is every result, in the order the API documents them.
var Results = []Result{OK, RateLimited, Blocked, Error, TargetError}

// Valid says whether r is a result the API takes.
func (r Result) Valid() bool {
	for _, v := range Results {
		if r == v {
			return true
		}
	}
	return false
}

// ResultOf is what a failure of class c is reported as; "" for the
// caller's and capacity (no verdict on any proxy), and for a ban, whose
// result is what the site did (RateLimited or Blocked).
func ResultOf(c Class) Result {
	switch c {
	case Proxy:
		return Error
	case Site:
		return TargetError
	}
	return ""
}

// Table is table.json: the rules and the cases every policy is held to.
type Table struct {
	// MarkerWindow is how much of a body is searched for BlockMarkers.
	MarkerWindow int `json:"markerWindow"`
	// BlockMarkers are words of block and captcha pages, matched
	// case-insensitively.
	BlockMarkers []string `json:"blockMarkers"`
	// ConnectStatus is whose fault a proxy's non-2xx answer to CONNECT is,
	// by status, when no Squid code in it says; ConnectDefault otherwise.
	ConnectStatus  map[string]Class `json:"connectStatus"`
	ConnectDefault Class            `json:"connectDefault"`
	// SquidErrors is whose fault a Squid error code (X-Squid-Error's
	// first word) on the proxy's own answer to CONNECT is.
	SquidErrors map[string]Class `json:"squidErrors"`
	// Responses and Connects are the cases.
	Responses []ResponseCase `json:"responses"`
	Connects  []ConnectCase  `json:"connects"`
}

// ResponseCase is a site's answer and its result. Its body is Pad bytes
// of "x" followed by Body.
type ResponseCase struct {
	Name    string            `json:"name"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Pad     int               `json:"pad"`
	Body    string            `json:"body"`
	Result  Result            `json:"result"`
}

// ConnectCase is a proxy's non-2xx answer to CONNECT and whose fault it is.
type ConnectCase struct {
	Name    string            `json:"name"`
	Status  int               `json:"status"`
	Headers map[string]string `json:"headers"`
	Class   Class             `json:"class"`
}

// Header is the case's headers as an http.Header.
func header(m map[string]string) http.Header {
	h := http.Header{}
	for k, v := range m {
		h.Set(k, v)
	}
	return h
}

// Header of the case.
func (c ResponseCase) Header() http.Header { return header(c.Headers) }

// Header of the case.
func (c ConnectCase) Header() http.Header { return header(c.Headers) }

// FullBody is the case's body, padding included.
func (c ResponseCase) FullBody() []byte {
	return append(bytes.Repeat([]byte("x"), c.Pad), c.Body...)
}

//go:embed table.json
var tableJSON []byte

// Default is the table the project ships.
var Default = mustParse(tableJSON)

var markers = markerPattern(Default.BlockMarkers)

func mustParse(b []byte) *Table {
	var t Table
	if err := json.Unmarshal(b, &t); err != nil {
		panic(fmt.Sprintf("faults: table.json: %v", err))
	}
	return &t
}

func markerPattern(words []string) *regexp.Regexp {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = regexp.QuoteMeta(w)
	}
	return regexp.MustCompile(`(?i)` + strings.Join(q, "|"))
}

// MarkerWindow is how much of a body Response searches for markers.
func MarkerWindow() int { return Default.MarkerWindow }

// Response is the result for a site's answer that came through the
// proxy: its status, headers and the first MarkerWindow bytes of its
// body. Only a 407 carrying a challenge blames the proxy: proxies drop a
// site's Proxy-Authenticate as hop-by-hop, so that answer is the proxy's
// own. A Squid error code on the answer is not trusted (a site can send
// one): Squid's pages for a site it could not reach are 5xx, which is
// the site's fault anyway.
func Response(status int, h http.Header, head []byte) Result {
	if len(head) > Default.MarkerWindow {
		head = head[:Default.MarkerWindow]
	}
	switch {
	case status == http.StatusProxyAuthRequired && h.Get("Proxy-Authenticate") != "":
		return Error
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable && h.Get("Retry-After") != "":
		return RateLimited
	case status == http.StatusForbidden, markers.Match(head):
		return Blocked
	case status >= 500:
		return TargetError
	}
	return OK
}

// Connect is whose fault a proxy's non-2xx answer to CONNECT is: the
// Squid code it carries when the table knows it, else its status.
func Connect(status int, h http.Header) Class {
	if c, ok := Default.SquidErrors[SquidCode(h)]; ok {
		return c
	}
	if c, ok := Default.ConnectStatus[strconv.Itoa(status)]; ok {
		return c
	}
	return Default.ConnectDefault
}

// SquidCode is X-Squid-Error's code ("ERR_CONNECT_FAIL" of
// "ERR_CONNECT_FAIL 111"); "" when there is none.
func SquidCode(h http.Header) string {
	code, _, _ := strings.Cut(h.Get("X-Squid-Error"), " ")
	return code
}
