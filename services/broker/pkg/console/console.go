// Package console serves the read-only web console: a page and its
// script, embedded in the broker's binary, that read the fleet through
// the lease API's own REST calls (pages, the watch and the operator's
// reads) with the caller's bearer token. The assets hold no data, so
// they are served to anyone; every byte of the fleet the page shows comes
// from a call the token authorizes, as it would for curl.
package console

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed assets
var assets embed.FS

// Path is where the console is served on the REST port.
const Path = "/console/"

// Handler serves the console under Path. The policy lets the page load
// only its own script and style and talk only to its own origin, so
// nothing is fetched from elsewhere and nothing injected runs.
func Handler() http.Handler {
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err)
	}
	files := http.StripPrefix(Path, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
