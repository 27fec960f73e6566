// Command baseline is bench-fleet's yardstick: the least a process can do
// to perform the job a service does, run on the same parts so the
// benchmark can print each service's figures as a ratio to it.
//
//	baseline informer --kubeconfig F   a bare controller-runtime informer on
//	                                   every Proxy and nothing else: the floor
//	                                   of memory and CPU for any process that
//	                                   keeps the fleet in view. Prints
//	                                   "synced" once the first list is in and
//	                                   runs until killed.
//	baseline probe --proxies A,B --url U --ca-file F --n N
//	                                   N probes in a row, each the least a
//	                                   probe can do (dial the proxy, CONNECT,
//	                                   verify the target, one GET, close),
//	                                   and prints the CPU microseconds each
//	                                   cost this process.
package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/config"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/certs"
	"github.com/egress-proxies/egress-proxies/pkg/kube"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: baseline informer|probe [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	// --kubeconfig is controller-runtime's own flag, on flag.CommandLine.
	proxies := flag.String("proxies", "", "comma-separated proxy addresses (probe)")
	target := flag.String("url", "", "https URL probed through them (probe)")
	caFile := flag.String("ca-file", "", "PEM CA of the target (probe)")
	n := flag.Int("n", 300, "probes to run (probe)")
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	var err error
	switch mode {
	case "informer":
		err = informer(ctx)
	case "probe":
		err = probes(strings.Split(*proxies, ","), *target, *caFile, *n)
	default:
		err = fmt.Errorf("unknown mode %q: want informer or probe", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func informer(ctx context.Context) error {
	cfg, err := config.GetConfig()
	if err != nil {
		return err
	}
	c, err := cache.New(cfg, cache.Options{Scheme: kube.NewScheme()})
	if err != nil {
		return err
	}
	if _, err := c.GetInformer(ctx, &v1.Proxy{}); err != nil {
		return err
	}
	go func() { _ = c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		return errors.New("the cache never synced")
	}
	fmt.Println("synced")
	<-ctx.Done()
	return nil
}

func probes(proxies []string, target, caFile string, n int) error {
	u, err := url.Parse(target)
	if err != nil || u.Scheme != "https" {
		return fmt.Errorf("--url %q: want an https URL", target)
	}
	roots, err := certs.LoadPool(caFile)
	if err != nil {
		return fmt.Errorf("--ca-file: %w", err)
	}
	before := cpu()
	for i := range n {
		if err := probe(proxies[i%len(proxies)], u, roots); err != nil {
			return fmt.Errorf("probe %d through %s: %w", i, proxies[i%len(proxies)], err)
		}
	}
	fmt.Printf("cpu-us-per-probe %d\n", (cpu()-before).Microseconds()/int64(n))
	return nil
}

func probe(proxy string, u *url.URL, roots *x509.CertPool) error {
	c, err := net.DialTimeout("tcp", proxy, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", u.Host, u.Host); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: http.MethodConnect})
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("CONNECT: %s", resp.Status)
	}
	// The prober's own curves: the least key exchange a TLS 1.3 probe needs.
	tc := tls.Client(c, &tls.Config{RootCAs: roots, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12, CurvePreferences: []tls.CurveID{tls.X25519}})
	if _, err := fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", u.RequestURI(), u.Host); err != nil {
		return err
	}
	if resp, err = http.ReadResponse(bufio.NewReader(tc), nil); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.Body.Close()
}

func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
