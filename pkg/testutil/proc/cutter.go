package proc

import (
	"io"
	"net"
	"sync"
)

// Cutter forwards TCP from its own loopback address to a target, and can
// cut the link (every connection closed, new ones refused) and restore it
// on the same address: a network partition between processes and a server
// that itself keeps running. It can also freeze the link: connections stay
// open and nothing moves either way, as when a host loses power or a
// firewall starts dropping packets, so no side learns the link is gone.
type Cutter struct {
	Addr   string
	target string
	dial   func(target string) (net.Conn, error)
	mu     sync.Mutex
	thawed *sync.Cond
	frozen bool
	ln     net.Listener
	conns  map[net.Conn]struct{}
}

// NewCutter starts forwarding to target.
func NewCutter(t T, target string) *Cutter {
	t.Helper()
	return NewCutterVia(t, target, func(target string) (net.Conn, error) { return net.Dial("tcp", target) })
}

// NewCutterVia is NewCutter with its own way of reaching target (from
// inside a network namespace, say).
func NewCutterVia(t T, target string, dial func(target string) (net.Conn, error)) *Cutter {
	t.Helper()
	c := &Cutter{target: target, dial: dial, conns: map[net.Conn]struct{}{}}
	c.thawed = sync.NewCond(&c.mu)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Addr = ln.Addr().String()
	c.serve(ln)
	t.Cleanup(c.Cut)
	return c
}

func (c *Cutter) serve(ln net.Listener) {
	c.mu.Lock()
	c.ln = ln
	c.mu.Unlock()
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := c.dial(c.target)
			if err != nil {
				_ = in.Close()
				continue
			}
			c.mu.Lock()
			c.conns[in], c.conns[out] = struct{}{}, struct{}{}
			c.mu.Unlock()
			go func() { _, _ = io.Copy(gate{c, out}, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(gate{c, in}, out); _ = in.Close() }()
		}
	}()
}

// gate holds writes while the link is frozen.
type gate struct {
	c *Cutter
	w io.Writer
}

func (g gate) Write(b []byte) (int, error) {
	g.c.mu.Lock()
	for g.c.frozen {
		g.c.thawed.Wait()
	}
	g.c.mu.Unlock()
	return g.w.Write(b)
}

// Freeze stops every byte on open and new connections, closing nothing.
func (c *Cutter) Freeze() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = true
}

// Thaw lets the held bytes through.
func (c *Cutter) Thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = false
	c.thawed.Broadcast()
}

// Cut closes every connection and stops accepting; it also thaws, so
// nothing stays held.
func (c *Cutter) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = false
	c.thawed.Broadcast()
	if c.ln != nil {
		_ = c.ln.Close()
		c.ln = nil
	}
	for conn := range c.conns {
		_ = conn.Close()
	}
	c.conns = map[net.Conn]struct{}{}
}

// Restore accepts again on the same address.
func (c *Cutter) Restore(t T) {
	t.Helper()
	ln, err := net.Listen("tcp", c.Addr)
	if err != nil {
		t.Fatalf("restoring %s: %v", c.Addr, err)
	}
	c.serve(ln)
}

// SilentListener accepts TCP connections on loopback and never answers:
// a proxy whose port is open but that cannot egress. It returns the
// address; everything closes when the test ends.
func SilentListener(t T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// NewBalancer forwards each new connection to the next of backends in
// turn, as a Kubernetes ClusterIP Service does: it balances connections,
// not requests or streams, so a client that keeps its connection keeps
// its backend. A connection to a backend that is down is closed at once.
func NewBalancer(t T, backends ...string) *Cutter {
	t.Helper()
	var mu sync.Mutex
	next := 0
	return NewCutterVia(t, "", func(string) (net.Conn, error) {
		mu.Lock()
		b := backends[next%len(backends)]
		next++
		mu.Unlock()
		return net.Dial("tcp", b)
	})
}
