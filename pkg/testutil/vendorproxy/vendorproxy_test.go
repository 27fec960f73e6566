package vendorproxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

func TestTheStandInEgressesPerSessionAndRefusesWhatAVendorWould(t *testing.T) {
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		_, _ = io.WriteString(w, host)
	}))
	defer echo.Close()
	p := Start(t, v1.PresetBrightData, "pw")
	get := func(user, pass string, tunnel bool) (int, string) {
		u := &url.URL{Scheme: "http", Host: p.Addr, User: url.UserPassword(user, pass)}
		target := echo.URL
		tr := &http.Transport{Proxy: http.ProxyURL(u)}
		if tunnel {
			// A CONNECT, as for https: the echo server speaks plain HTTP
			// inside the tunnel.
			tr = &http.Transport{DialContext: (&tunnelDialer{proxy: p.Addr, user: user, pass: pass}).dial}
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get(target)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, a := get("brd-customer-c1-zone-z-country-us-session-a", "pw", false)
	require.Equal(t, 200, code)
	_, a2 := get("brd-customer-c1-zone-z-country-us-session-a", "pw", true)
	_, b := get("brd-customer-c1-zone-z-country-de-session-a", "pw", false)
	assert.Equal(t, a, a2, "one session, one exit, plain or tunnelled")
	assert.NotEqual(t, a, b, "another country's session is another exit")
	exit, ok := p.Exit("us", "a")
	require.True(t, ok)
	assert.Equal(t, exit.String(), a)
	moved := p.Rotate("us", "a")
	_, a3 := get("brd-customer-c1-zone-z-country-us-session-a", "pw", false)
	assert.Equal(t, moved.String(), a3)

	code, _ = get("brd-customer-c1-zone-z-city-paris-session-a", "pw", false)
	assert.Equal(t, http.StatusProxyAuthRequired, code)
	code, _ = get("brd-customer-c1-zone-z-session-a", "wrong", false)
	assert.Equal(t, http.StatusProxyAuthRequired, code)
	refused := p.Refused()
	assert.Equal(t, 1, refused["wrong password"])
	assert.Len(t, refused, 2)
}

type tunnelDialer struct{ proxy, user, pass string }

func (d *tunnelDialer) dial(_ context.Context, _, addr string) (net.Conn, error) {
	c, err := net.Dial("tcp", d.proxy)
	if err != nil {
		return nil, err
	}
	req := &http.Request{Method: http.MethodConnect, URL: &url.URL{Opaque: addr}, Host: addr, Header: http.Header{}}
	req.SetBasicAuth(d.user, d.pass)
	req.Header.Set("Proxy-Authorization", req.Header.Get("Authorization"))
	req.Header.Del("Authorization")
	if err := req.Write(c); err != nil {
		return nil, err
	}
	buf := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
	if _, err := io.ReadFull(c, buf); err != nil {
		return nil, err
	}
	return c, nil
}
