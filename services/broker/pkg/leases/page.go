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
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:8])
}

func pageToken(filter, after string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tokenVersion + ":" + filter + ":" + after))
}

// page checks the request's page fields and returns its page of the
// sorted matches, and the token of the page after it ("" on the last).
func page(req *leasev1.ListProxiesRequest, matches []inventory.Proxy) ([]inventory.Proxy, string, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, "", status.Errorf(codes.InvalidArgument, "page_size must not be negative, got %d", size)
	case size == 0 || size > MaxPageSize:
		size = MaxPageSize
	}
	filter := filterOf(req)
	start := 0
	if tok := req.GetPageToken(); tok != "" {
		raw, err := base64.RawURLEncoding.DecodeString(tok)
		parts := strings.SplitN(string(raw), ":", 3)
		switch {
		case err != nil || len(parts) != 3 || parts[0] != tokenVersion:
			return nil, "", status.Errorf(codes.InvalidArgument, "page_token %q is not a token this API gave", tok)
		case parts[1] != filter:
			return nil, "", status.Error(codes.InvalidArgument, "page_token was given for other filters: namespace, selector, healthy and target must be those of the first page")
		}
		after := parts[2]
		start = sort.Search(len(matches), func(i int) bool { return matches[i].ID > after })
	}
	end := min(start+size, len(matches))
	next := ""
	if end < len(matches) {
		next = pageToken(filter, matches[end-1].ID)
	}
	return matches[start:end], next, nil
}
