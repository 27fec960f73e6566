package leases

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	leasev1 "github.com/egress-proxies/egress-proxies/pkg/gen/egressproxies/lease/v1"
	"github.com/egress-proxies/egress-proxies/services/broker/pkg/inventory"
)

// MaxPageSize bounds a ListProxies page, and is the size of one that
// asks for none: a proxy with the 32 attributes of 63-character keys and
// values the CRD allows is about 4.2 KB, so 500 stay near 2 MiB, half of
// gRPC's default message limit.
const MaxPageSize = 500

// A page token names the last id of the page before and the filters it
// was taken under (AIP-158: a token is refused with other filters). It is
// opaque to clients; "1" versions the layout.
const tokenVersion = "1"

// filterOf fingerprints what a page token is bound to: every field of
// the request but the page's own.
func filterOf(req *leasev1.ListProxiesRequest) string {
	keys := make([]string, 0, len(req.GetSelector()))
	for k := range req.GetSelector() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	buf := strconv.AppendQuote(nil, req.GetNamespace())
	buf = strconv.AppendQuote(buf, req.GetTarget())
	if req.Healthy != nil {
		buf = strconv.AppendBool(buf, req.GetHealthy())
	}
	for _, k := range keys {
		buf = strconv.AppendQuote(strconv.AppendQuote(buf, k), req.GetSelector()[k])
	}
	return fingerprint(buf)
}

func fingerprint(buf []byte) string {
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:8])
}

func pageToken(filter, after string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tokenVersion + ":" + filter + ":" + after))
}

// cursor is where a page starts, how many it holds, and the filters a
// token for the next one is bound to.
type cursor struct {
	after, filter string
	size          int
}

// readCursor checks the request's page fields.
func readCursor(req *leasev1.ListProxiesRequest) (cursor, error) {
	return newCursor(req.GetPageSize(), req.GetPageToken(), filterOf(req))
}

// newCursor checks a list's page size and token, the token bound to
// filter, its other fields' fingerprint.
func newCursor(size int32, tok, filter string) (cursor, error) {
	c := cursor{size: int(size), filter: filter}
	switch {
	case c.size < 0:
		return c, status.Errorf(codes.InvalidArgument, "page_size must not be negative, got %d", c.size)
	case c.size == 0 || c.size > MaxPageSize:
		c.size = MaxPageSize
	}
	if tok == "" {
		return c, nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	parts := strings.SplitN(string(raw), ":", 3)
	switch {
	case err != nil || len(parts) != 3 || parts[0] != tokenVersion:
		return c, status.Errorf(codes.InvalidArgument, "page_token %q is not a token this API gave", tok)
	case parts[1] != c.filter:
		return c, status.Error(codes.InvalidArgument, "page_token was given for other filters: every field but the page's own must be as it was for the first page")
	}
	c.after = parts[2]
	return c, nil
}

// next is the token of the page after page ("" when none matches beyond
// it).
func (c cursor) next(page []inventory.Proxy, more bool) string {
	if !more || len(page) == 0 {
		return ""
	}
	return pageToken(c.filter, page[len(page)-1].ID)
}
