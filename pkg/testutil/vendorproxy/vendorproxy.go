// Package vendorproxy is the suites' stand-in for a proxy vendor's
// back-connect endpoint: one host and port behind which every session
// name is another exit. It is a real CONNECT and plain-HTTP proxy on
// loopback that reads each request's user name in the vendor's grammar
// (package vendors, the table the controller writes and the gateway
// reads), answers a malformed one or a wrong password with 407 as the
// vendors do, and egresses each (country, session) from a loopback
// address of its own, kept until Rotate moves it, so a target sees one
// exit per session.
package vendorproxy

import (
	"bufio"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/egress-proxies/egress-proxies/pkg/api/v1alpha1"
	"github.com/egress-proxies/egress-proxies/pkg/vendors"
)

// Proxy is a running stand-in.
type Proxy struct {
	// Addr is host:port; Host and Port its parts.
	Addr string
	Host string
	Port int

	preset   v1.VendorPreset
	password string
	ln       net.Listener

	mu    sync.Mutex
	exits map[string]netip.Addr
	next  int
	// refused counts 407s, by reason.
	refused map[string]int
}

// firstExit is where exits start: clear of 127.0.0.1 and of the kubelet
// stand-in's pod addresses.
var firstExit = netip.MustParseAddr("127.0.200.1")

// Start runs a stand-in for preset whose account password is password,
// until t's cleanups.
func Start(t testing.TB, preset v1.VendorPreset, password string) *Proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	p := &Proxy{Addr: ln.Addr().String(), Host: "127.0.0.1", Port: addr.Port, preset: preset, password: password, ln: ln,
		exits: map[string]netip.Addr{}, refused: map[string]int{}}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close() })
	return p
}

func key(country, session string) string { return country + "/" + session }

// Exit is the address (country, session) egresses from, if it has been
// seen.
func (p *Proxy) Exit(country, session string) (netip.Addr, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a, ok := p.exits[key(country, session)]
	return a, ok
}

// Exits are every session's exit, by "country/session".
func (p *Proxy) Exits() map[string]netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]netip.Addr, len(p.exits))
	for k, v := range p.exits {
		out[k] = v
	}
	return out
}

// Rotate gives (country, session) a new exit, as a vendor does when a
// residential peer goes away, and returns it.
func (p *Proxy) Rotate(country, session string) netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := p.allocate()
	p.exits[key(country, session)] = a
	return a
}

// Refused counts the 407s answered, by the reason given.
func (p *Proxy) Refused() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.refused {
		out[k] = v
	}
	return out
}

// allocate is the next unused exit; p.mu is held.
func (p *Proxy) allocate() netip.Addr {
	b := firstExit.As4()
	n := int(b[2])<<8 | int(b[3]) + p.next
	p.next++
	return netip.AddrFrom4([4]byte{127, byte(n >> 16), byte(n >> 8), byte(n)})
}

// exit is the session's exit, allocated on first sight; a request with
// no session gets a fresh one, as a rotating endpoint does.
func (p *Proxy) exit(s vendors.Session) netip.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	if s.ID == "" {
		return p.allocate()
	}
	k := key(s.Country, s.ID)
	a, ok := p.exits[k]
	if !ok {
		a = p.allocate()
		p.exits[k] = a
	}
	return a
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) handle(c net.Conn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	s, why := p.authorize(req)
	if why != "" {
		p.mu.Lock()
		p.refused[why]++
		p.mu.Unlock()
		_, _ = fmt.Fprintf(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"vendor\"\r\nX-Vendor-Error: %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", why)
		return
	}
	target := req.Host
	if req.Method != http.MethodConnect {
		target = req.URL.Host
		if req.URL.Port() == "" {
			target = net.JoinHostPort(req.URL.Hostname(), "80")
		}
	}
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: p.exit(s).AsSlice()}}
	up, err := d.Dial("tcp", target)
	if err != nil {
		_, _ = fmt.Fprintf(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
		return
	}
	defer func() { _ = up.Close() }()
	_ = up.SetDeadline(time.Now().Add(30 * time.Second))
	if req.Method == http.MethodConnect {
		if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return
		}
	} else {
		req.Header.Del("Proxy-Authorization")
		req.Close = true
		if err := req.Write(up); err != nil {
			return
		}
	}
	done := make(chan struct{})
	go func() { _, _ = io.Copy(up, br); closeWrite(up); close(done) }()
	_, _ = io.Copy(c, up)
	closeWrite(c)
	<-done
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}

// authorize reads the request's credentials: the session they name, or
// why a vendor would refuse them.
func (p *Proxy) authorize(req *http.Request) (vendors.Session, string) {
	h := req.Header.Get("Proxy-Authorization")
	enc, ok := strings.CutPrefix(h, "Basic ")
	if !ok {
		return vendors.Session{}, "no credentials"
	}
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		return vendors.Session{}, "credentials not base64"
	}
	user, pass, _ := strings.Cut(string(raw), ":")
	s, err := vendors.Parse(p.preset, user)
	switch {
	case err != nil:
		return s, strconv.Quote(err.Error())
	case pass != p.password:
		return s, "wrong password"
	}
	return s, ""
}
