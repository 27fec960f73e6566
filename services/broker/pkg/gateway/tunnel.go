package gateway

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// tunnel splices a client and the leased proxy's CONNECT tunnel both
// ways. Between two *net.TCPConn io.Copy is splice(2): the bytes never
// enter the process, and an idle tunnel holds no buffer, only its two
// goroutines parked in the poller.
//
// Idle time is measured without counting bytes as they pass: each
// direction copies under a read deadline one idle timeout away; a copy
// that times out having moved nothing marks its direction idle, and the
// tunnel closes when both are. A tunnel thus closes between one and two
// idle timeouts after its last byte, and at its deadline at the latest.
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
// client's side ended first, or the proxy's at EOF, or the gateway cut
// it (idle, deadline, shutdown); not the proxy's side failing first.
func (t *tunnel) run() (sent, received int64, clean bool) {
	_ = t.client.SetWriteDeadline(t.deadline)
	_ = t.up.SetWriteDeadline(t.deadline)
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
	return out.n, in.n, t.cut.Load() || first == out || in.err == nil
}

// close closes both ends, once.
func (t *tunnel) close() {
	t.once.Do(func() {
		_ = t.client.Close()
		_ = t.up.Close()
	})
}

// shut ends the tunnel from the gateway's side.
func (t *tunnel) shut() {
	t.cut.Store(true)
	t.close()
}

func (t *tunnel) pump(h, other *half) {
	defer t.first.CompareAndSwap(nil, h)
	for {
		d := time.Now().Add(t.idle)
		if d.After(t.deadline) {
			d = t.deadline
		}
		_ = h.src.SetReadDeadline(d)
		n, err := io.Copy(h.dst, h.src)
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
		case errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(t.deadline):
			if n == 0 {
				h.idle.Store(true)
				if other.idle.Load() {
					t.shut()
					return
				}
			}
		case errors.Is(err, os.ErrDeadlineExceeded):
			t.shut()
			return
		default:
			h.err = err
			t.close()
			return
		}
	}
}
