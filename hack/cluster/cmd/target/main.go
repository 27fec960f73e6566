// Command target is the crawl and probe target inside the cluster:
// HTTPS with a certificate from files (a Secret the end-to-end test
// made), or plain HTTP with --http (the README's local cluster, which has
// no CA to hand out), answering 204 on /ok (the probe), the caller's address on /ip (the
// proxy's egress IP) and 429 on /ban (a site that rate-limits).
package main

import (
	"crypto/tls"
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/egress-proxies/egress-proxies/pkg/testutil/tlstarget"
)

func main() {
	addr := flag.String("addr", ":8443", "address to serve HTTPS on")
	cert := flag.String("cert", "/etc/target/tls.crt", "PEM certificate")
	key := flag.String("key", "/etc/target/tls.key", "PEM key")
	plain := flag.Bool("http", false, "serve plain HTTP on --addr instead of HTTPS")
	flag.Parse()
	mux := http.NewServeMux()
	mux.Handle("/", tlstarget.Handler())
	mux.HandleFunc("/ban", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Retry-After", "60")
		http.Error(w, "slow down", http.StatusTooManyRequests)
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12}}
	if *plain {
		log.Printf("target: serving HTTP on %s", *addr)
		log.Fatal(srv.ListenAndServe())
	}
	log.Printf("target: serving HTTPS on %s", *addr)
	log.Fatal(srv.ListenAndServeTLS(*cert, *key))
}
