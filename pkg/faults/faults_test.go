package faults

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The table's own cases, the ones the Python and Node policies are held
// to as well.
func TestResponseCases(t *testing.T) {
	require.NotEmpty(t, Default.Responses)
	for _, c := range Default.Responses {
		t.Run(c.Name, func(t *testing.T) {
			assert.Equal(t, c.Result, Response(c.Status, c.Header(), c.FullBody()))
		})
	}
}

func TestConnectCases(t *testing.T) {
	require.NotEmpty(t, Default.Connects)
	for _, c := range Default.Connects {
		t.Run(c.Name, func(t *testing.T) {
			assert.Equal(t, c.Class, Connect(c.Status, c.Header()))
		})
	}
}

// Every class the table names is one of the five, and every result one
// the API takes: a typo in table.json fails here, not in a crawl.
func TestTableNamesOnlyKnownClasses(t *testing.T) {
	known := map[Class]bool{Proxy: true, Site: true, Ban: true, Caller: true, Capacity: true}
	for code, c := range Default.SquidErrors {
		assert.True(t, known[c], "squidErrors[%s] = %q", code, c)
	}
	for status, c := range Default.ConnectStatus {
		assert.True(t, known[c], "connectStatus[%s] = %q", status, c)
	}
	assert.True(t, known[Default.ConnectDefault])
	for _, c := range Default.Responses {
		assert.True(t, c.Result.Valid(), "%s: result %q", c.Name, c.Result)
	}
	for _, c := range Default.Connects {
		assert.True(t, known[c.Class], "%s: class %q", c.Name, c.Class)
	}
}

func TestResultOfClass(t *testing.T) {
	assert.Equal(t, Error, ResultOf(Proxy), "the proxy's own failure counts against it")
	assert.Equal(t, TargetError, ResultOf(Site), "the site's counts against no proxy")
	assert.Empty(t, ResultOf(Caller), "the caller's own failure is no verdict on a proxy")
	assert.Empty(t, ResultOf(Capacity))
	for _, r := range []Result{ResultOf(Proxy), ResultOf(Site)} {
		assert.True(t, r.Valid(), "%s is a result the API takes", r)
	}
	assert.False(t, Result("fail").Valid())
}

func TestSquidCode(t *testing.T) {
	assert.Equal(t, "ERR_CONNECT_FAIL", SquidCode(http.Header{"X-Squid-Error": {"ERR_CONNECT_FAIL 111"}}))
	assert.Equal(t, "ERR_DNS_FAIL", SquidCode(http.Header{"X-Squid-Error": {"ERR_DNS_FAIL"}}))
	assert.Empty(t, SquidCode(http.Header{}))
}
