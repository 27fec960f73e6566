// Command clientenv brings the whole system up on loopback for the Python
// and Node clients' suites and the crawl examples, and describes it in a
// JSON file they read: the system package's processes (API server, Redis,
// controller, prober, broker 0 over TLS with a bearer token, broker 1 in
// plaintext, each serving the proxy gateway), three Managed
// kubernetes-provider proxies (real Squids, each egressing from an
// address of its own and keeping an access log), and a small site to
// crawl that rate-limits one of those exit IPs. It runs
// until SIGTERM or until its standard input closes, so a suite that dies
// takes it down.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egress-proxies/egress-proxies/hack/demo/system"
	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
)

// Env is what the file describes; the suites read it as JSON.
type Env struct {
	// GRPCTLS is broker 0's gRPC address, serving TLS with CAFile's CA.
	GRPCTLS string `json:"grpcTLS"`
	// GRPCPlain is broker 1's, in plaintext; the same Redis and fleet.
	GRPCPlain string `json:"grpcPlain"`
	// GRPCReportLimited is broker 2 (plaintext), which takes 10 reports a
	// second from the token.
	GRPCReportLimited string `json:"grpcReportLimited"`
	CAFile            string `json:"caFile"`
	// REST is broker 1's REST API.
	REST string `json:"rest"`
	// Ops are the brokers' ops addresses (http://host:port; /metrics).
	Ops   []string `json:"ops"`
	Token string   `json:"token"`
	// Gateway is broker 1's proxy gateway (host:port); the token is its
	// password.
	Gateway string `json:"gateway"`
	// Namespace and Selector pick the three proxies.
	Namespace string            `json:"namespace"`
	Selector  map[string]string `json:"selector"`
	Proxies   []Proxy           `json:"proxies"`
	// Site is the crawl site's root (http://127.0.0.1:port/), Pages how
	// many pages it links from its root, LimitedIP the exit IP it answers
	// 429 to.
	Site string `json:"site"`
	// OtherSite is the same site on another address (another target), for
	// tests that must not share the examples' cooldowns.
	OtherSite string `json:"otherSite"`
	// GatewaySite is the same site on a third address, the gateway
	// suite's own target.
	GatewaySite string `json:"gatewaySite"`
	Pages       int    `json:"pages"`
	LimitedIP   string `json:"limitedIP"`
	// HTTPSEcho echoes the caller's IP over HTTPS (/ip), with its own CA
	// in HTTPSEchoCA: a CONNECT through a leased proxy.
	HTTPSEcho   string `json:"httpsEcho"`
	HTTPSEchoCA string `json:"httpsEchoCA"`
}

// Proxy is one proxy of the fleet.
type Proxy struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	EgressIP string `json:"egressIP"`
	// AccessLog is its Squid's access log.
	AccessLog string `json:"accessLog"`
}

const token = "crawler-token-of-this-environment"

func main() {
	out := flag.String("out", "", "file to write the environment's description to (JSON), once it is up")
	dir := flag.String("dir", ".clientenv", "working directory for logs and data")
	pages := flag.Int("pages", 20, "pages the crawl site links from its root")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "--out is required")
		os.Exit(2)
	}
	r := system.NewRunner(*dir)
	defer r.Stop()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()

	env := r.StartAPIServer()
	// Broker 2 holds the token to 10 reports a second, as a team's
	// tokenLimits would: the clients' suites show a lease block's report
	// refused at that rate is never raised.
	s := system.Start(r, env, system.Options{Probers: 1, Brokers: 3, BrokerTLS: true, BrokerToken: token, ProxyCredentials: true, Gateway: true,
		BrokerArgs:     map[int][]string{2: {"--token-report-rate", "10", "--token-report-burst", "10"}},
		HealthInterval: time.Second, Step: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})

	const ns = "crawl"
	selector := map[string]string{"pool": "crawl"}
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		r.Fatalf("creating namespace %s: %v", ns, err)
	}
	for i := range 3 {
		px := &v1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("crawl-%d", i), Namespace: ns},
			Spec: v1.ProxySpec{Mode: v1.ModeManaged, Provider: "kubernetes", Attributes: selector}}
		if err := env.Client.Create(ctx, px); err != nil {
			r.Fatalf("creating %s: %v", px.Name, err)
		}
	}
	var ready []v1.Proxy
	deadline := time.Now().Add(2 * time.Minute)
	for len(ready) < 3 {
		if time.Now().After(deadline) {
			r.Fatalf("the three proxies did not turn Ready and Healthy within 2m (%d did); look at the controller log", len(ready))
		}
		time.Sleep(200 * time.Millisecond)
		list := &v1.ProxyList{}
		if err := env.Client.List(ctx, list, client.InNamespace(ns)); err != nil {
			continue
		}
		ready = ready[:0]
		for _, px := range list.Items {
			if px.Status.Phase == v1.PhaseReady && px.Status.IsHealthy() && px.Status.EgressIP != "" {
				ready = append(ready, px)
			}
		}
	}
	sort.Slice(ready, func(i, j int) bool { return ready[i].Name < ready[j].Name })

	e := Env{GRPCTLS: s.Brokers[0].GRPC, GRPCPlain: s.Brokers[1].GRPC, CAFile: s.BrokerCA, REST: s.Brokers[1].REST, Token: token, Gateway: s.Brokers[1].Gateway,
		Namespace: ns, Selector: selector, Pages: *pages, LimitedIP: ready[0].Status.EgressIP,
		HTTPSEcho: s.Target.URL, HTTPSEchoCA: s.Target.CAFile, Ops: []string{s.Brokers[0].Ops, s.Brokers[1].Ops, s.Brokers[2].Ops},
		GRPCReportLimited: s.Brokers[2].GRPC}
	for _, px := range ready {
		p := Proxy{ID: ns + "/" + px.Name, Addr: net.JoinHostPort(px.Status.IP, strconv.Itoa(int(px.Status.Port))), EgressIP: px.Status.EgressIP}
		pods := &corev1.PodList{}
		if err := env.Client.List(ctx, pods, client.InNamespace(system.PodNamespace)); err != nil {
			r.Fatalf("listing pods: %v", err)
		}
		for _, pod := range pods.Items {
			if sq := s.Kubelet.Squid(string(pod.UID)); sq != nil && sq.Addr == p.Addr {
				p.AccessLog = sq.AccessLog
			}
		}
		e.Proxies = append(e.Proxies, p)
	}

	site := &site{pages: *pages, limited: e.LimitedIP, log: []request{}}
	for _, at := range []struct {
		host string
		url  *string
	}{{"127.0.0.1", &e.Site}, {"127.0.0.2", &e.OtherSite}, {"127.0.0.3", &e.GatewaySite}} {
		ln, err := net.Listen("tcp", at.host+":0")
		if err != nil {
			r.Fatalf("crawl site: %v", err)
		}
		srv := &http.Server{Handler: site, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		r.Cleanup(func() { _ = srv.Close() })
		*at.url = "http://" + ln.Addr().String() + "/"
	}

	b, _ := json.MarshalIndent(e, "", "  ")
	tmp := *out + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		r.Fatalf("%v", err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		r.Fatalf("%v", err)
	}
	fmt.Printf("clientenv is up; described in %s\n%s\n", *out, b)
	<-ctx.Done()
}

// site is the crawl examples' target: a root linking Pages pages, each
// linking back, and a log of who asked for what at /_requests (asked
// directly, not through a proxy). It answers 429 to its limited exit IP,
// as a site rate-limiting one proxy does.
type site struct {
	pages   int
	limited string
	mu      sync.Mutex
	log     []request
}

type request struct {
	From   string `json:"from"`
	Path   string `json:"path"`
	Status int    `json:"status"`
}

func (s *site) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/_requests" {
		s.mu.Lock()
		b, _ := json.Marshal(s.log)
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(b)
		return
	}
	from, _, _ := net.SplitHostPort(r.RemoteAddr)
	status := http.StatusOK
	page := 0
	switch {
	case from == s.limited:
		status = http.StatusTooManyRequests
	case r.URL.Path == "/":
	default:
		num, ok := strings.CutPrefix(r.URL.Path, "/p/")
		n, err := strconv.Atoi(num)
		if !ok || err != nil || n < 1 || n > s.pages {
			status = http.StatusNotFound
		}
		page = n
	}
	s.mu.Lock()
	s.log = append(s.log, request{From: from, Path: r.URL.Path, Status: status})
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	switch status {
	case http.StatusTooManyRequests:
		w.Header().Set("Retry-After", "60")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, "<html><body>Too many requests from your address; slow down.</body></html>")
	case http.StatusNotFound:
		http.NotFound(w, r)
	default:
		if page == 0 {
			_, _ = io.WriteString(w, "<html><head><title>crawl site</title></head><body><ul>")
			for i := 1; i <= s.pages; i++ {
				fmt.Fprintf(w, `<li><a href="/p/%d">page %d</a></li>`, i, i)
			}
			_, _ = io.WriteString(w, "</ul></body></html>")
			return
		}
		fmt.Fprintf(w, `<html><head><title>page %d</title></head><body><h1>page %d</h1><a href="/">home</a></body></html>`, page, page)
	}
}
