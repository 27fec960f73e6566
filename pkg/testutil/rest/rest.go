// Package rest makes one HTTP call for a test and reads the whole answer,
// JSON included, so tests of the REST API assert on status and fields.
package rest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// Reply is an answer read whole.
type Reply struct {
	Status int
	Body   []byte
	// JSON is the body decoded as an object; nil when it is not one.
	JSON map[string]any
	// Header is the response's header.
	Header http.Header
}

// Do sends method url with body ("" for none) and header pairs (name,
// value, ...), failing t when the call itself fails.
func Do(t testing.TB, method, url, body string, header ...string) Reply {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	r := Reply{Status: resp.StatusCode, Header: resp.Header}
	r.Body, _ = io.ReadAll(resp.Body)
	if len(bytes.TrimSpace(r.Body)) > 0 {
		_ = json.Unmarshal(r.Body, &r.JSON)
	}
	return r
}
