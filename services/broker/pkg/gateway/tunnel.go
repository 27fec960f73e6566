package gateway

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// tunnel splices a client and the leased proxy's CONNECT tunnel both
// ways. Between two *net.TCPConn io.Copy is splice(2): the bytes never
// enter the process, and an idle tunnel holds no buffer, only its two
// goroutines parked in the poller.
//
// Each direction waits for a byte (holding no pipe), then splices while
// bytes flow. A wait that lasts an idle timeout marks its direction idle,
// and the tunnel closes when both are: between one and two idle timeouts
// after its last byte, and at its deadline at the latest.
type tunnel struct {
	client, up net.Conn
	idle       time.Duration
	deadline   time.Time
	once       sync.Once
	// cut is set when the gateway closed the tunnel (idle, deadline,
	// shutdown): the errors that follow are its own doing.
	cut atomic.Bool
	// first is the direction that ended first.
	first atomic.Pointer[half]
	// bytes meters the tunnel as it flows; nil: unmetered.
	bytes *byteMeter
}

// half is one direction's copy.
type half struct {
	dst, src net.Conn
	n        int64
	idle     atomic.Bool
	// err is the read or write error that ended it; nil for EOF.
	err error
}

// run splices until both directions end, and returns the bytes sent
// (client to proxy) and received, and whether it ended cleanly: the
// client's side ended first, or the proxy's at EOF or with a reset, or
// the gateway cut it (idle, deadline, shutdown); not the proxy's side
// failing first in another way (a timeout, an unreachable host). A reset
// counts as an end: Squid resets a finished tunnel whenever the client's
// last bytes (its TLS close_notify) reached it unread, so the ok of
// every few tunnels would be lost to it, and a reset says no more of a
// proxy than the FIN it stands for.
func (t *tunnel) run() (sent, received int64, clean bool) {
	out := &half{dst: t.up, src: t.client}
	in := &half{dst: t.client, src: t.up}
	done := make(chan struct{})
	go func() {
		t.pump(out, in)
		close(done)
	}()
	t.pump(in, out)
	<-done
	t.close()
	// Whatever the client's side ended with (it closed, or reset) is the
	// client's doing; the proxy's side failing first is not clean.
	first := t.first.Load()
	return out.n, in.n, t.cut.Load() || first == out || in.err == nil || errors.Is(in.err, syscall.ECONNRESET)
}

// close closes both ends, once.
func (t *tunnel) close() {
	t.once.Do(func() {
		_ = t.client.Close()
		_ = t.up.Close()
	})
}

// shut ends the tunnel from the gateway's side, for why (a
// tunnelEnds label), once.
func (t *tunnel) shut(why string) {
	if t.cut.CompareAndSwap(false, true) {
		tunnelEnds.WithLabelValues(why).Inc()
	}
	t.close()
}

func (t *tunnel) pump(h, other *half) {
	defer t.first.CompareAndSwap(nil, h)
	// A source the poller cannot be asked about (a TLS client) is read
	// with the idle timeout as its window: a window that passes without
	// a byte is idleness.
	pollable := isPollable(h.src)
	window := min(activeWindow, t.idle/2)
	if !pollable {
		window = t.idle
	}
	for {
		if pollable {
			// Wait for a byte without holding anything but the goroutine:
			// splice holds a pipe (two descriptors) while it waits, which
			// idle tunnels would multiply.
			_ = h.src.SetReadDeadline(t.until(t.idle))
			if err := waitReadable(h.src); err != nil {
				if !t.timedOut(h, err) || t.idled(h, other) {
					return
				}
				continue
			}
			h.idle.Store(false)
		}
		// Splice while bytes flow, for up to window; then wait again. A
		// write that waits an idle timeout past the window is a side that
		// stopped reading: it would hold the tunnel, and its lease, to
		// the tunnel's deadline.
		_ = h.src.SetReadDeadline(t.until(window))
		writeBy := t.until(window + t.idle)
		_ = h.dst.SetWriteDeadline(writeBy)
		n, err := t.copy(h)
		h.n += n
		if n > 0 {
			h.idle.Store(false)
		}
		switch {
		case err == nil:
			// EOF: pass the half-close on; the other direction may still
			// be answering.
			if cw, ok := h.dst.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			h.idle.Store(true)
			return
		case errors.Is(err, errOverQuota):
			t.shut("quota")
			return
		case errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(writeBy) && writeBy.Before(t.deadline):
			t.shut("stalled")
			return
		case !t.timedOut(h, err):
			return
		case !pollable && n == 0 && t.idled(h, other):
			return
		}
	}
}

// copy splices h until its source ends or fails. A metered tunnel
// splices meterStep bytes at a time and counts each step as it goes, so
// a tunnel passing its tenant's quota ends within a step or two of it
// rather than when it closes.
func (t *tunnel) copy(h *half) (int64, error) {
	if t.bytes == nil {
		return io.Copy(h.dst, h.src)
	}
	var n int64
	for {
		lr := io.LimitedReader{R: h.src, N: meterStep}
		m, err := io.Copy(h.dst, &lr)
		n += m
		if !t.bytes.add(m) {
			return n, errOverQuota
		}
		if err != nil || lr.N > 0 {
			return n, err // an end, a failure, or a deadline
		}
	}
}

// idled marks h idle, and ends the tunnel if the other direction is too.
func (t *tunnel) idled(h, other *half) bool {
	h.idle.Store(true)
	if other.idle.Load() {
		t.shut("idle")
		return true
	}
	return false
}

// timedOut says whether err is a read deadline short of the tunnel's own,
// after which h goes on; any other error ends the tunnel.
func (t *tunnel) timedOut(h *half, err error) bool {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(t.deadline):
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		t.shut("deadline")
	default:
		h.err = err
		// First before the close: the close ends the other half too, and
		// its return must not race this one's to be first.
		t.first.CompareAndSwap(nil, h)
		t.close()
	}
	return false
}

// activeWindow is how long a direction splices before it checks in: an
// idle tunnel gives its pipes back within it.
const activeWindow = time.Second

// until is d from now, or the tunnel's deadline if sooner.
func (t *tunnel) until(d time.Duration) time.Time {
	if at := time.Now().Add(d); at.Before(t.deadline) {
		return at
	}
	return t.deadline
}

// isPollable says whether waitReadable can wait on c without reading it.
func isPollable(c net.Conn) bool {
	_, ok := c.(syscall.Conn)
	return ok
}

// waitReadable returns once c has a byte to read, or its end (EOF, an
// error: the copy that follows meets it), or its read deadline passes.
func waitReadable(c net.Conn) error {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return !errors.Is(err, syscall.EAGAIN)
	})
}

// bounded is a connection each read and write of which must make
// progress within an idle timeout, and all by a deadline: a plain
// request's client that stops reading, or a site that stops sending,
// ends it rather than holding its lease to the tunnel's timeout.
type bounded struct {
	net.Conn
	idle     time.Duration
	deadline time.Time
}

func (b bounded) next() time.Time {
	if at := time.Now().Add(b.idle); at.Before(b.deadline) {
		return at
	}
	return b.deadline
}

func (b bounded) Read(p []byte) (int, error) {
	_ = b.Conn.SetReadDeadline(b.next())
	return b.Conn.Read(p)
}

func (b bounded) Write(p []byte) (int, error) {
	_ = b.Conn.SetWriteDeadline(b.next())
	return b.Conn.Write(p)
}
