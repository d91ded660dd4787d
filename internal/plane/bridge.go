package plane

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/pace"
)

// bridge is one connection of either plane: the platform's end (host)
// and the stream to the agent.
type bridge struct {
	id     uint64
	kind   string // "data" or "egress"
	conn   string // an egress connection's id
	start  time.Time
	host   *net.UnixConn
	stream *channel.Stream

	held atomic.Int64 // bytes read from one end, not yet written to the other
	last atomic.Int64 // unix ns of the last byte either way

	mu    sync.Mutex // guards ended, and stream and host while attaching
	ended bool
}

func (b *bridge) touch() { b.last.Store(time.Now().UnixNano()) }

func (b *bridge) connSuffix() string {
	if b.conn == "" {
		return ""
	}
	return " (conn=" + b.conn + ")"
}

// end aborts both sides: the stream is reset (the tenant's connection
// closes) and the platform's connection is closed.
func (b *bridge) end(why string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ended {
		return
	}
	b.ended = true
	if b.stream != nil {
		b.stream.Reset(why)
	}
	if b.host != nil {
		b.host.Close()
	}
}

// finish marks a bridge that ran to its end, so a late end is a no-op.
func (b *bridge) finish() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
}

// attach sets the bridge's ends once they exist; false (and both ends
// given are ended) when the bridge was ended meanwhile (the planes are
// closing).
func (b *bridge) attach(s *channel.Stream, host *net.UnixConn) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s != nil {
		b.stream = s
	}
	if host != nil {
		b.host = host
	}
	if b.ended {
		if s != nil {
			s.Reset("the sandbox is stopping")
		}
		if host != nil {
			host.Close()
		}
		return false
	}
	return true
}

// bufSize is a copy's chunk: a channel frame's payload.
const bufSize = 32 << 10

// run copies both ways until both directions are done, then closes the
// platform's connection. An orderly end on one side is passed on as a
// half-close; an error on either side ends both. idleMS > 0 reaps a
// connection with no byte either way for that long.
func (p *Planes) run(b *bridge, idleMS int64) {
	defer b.finish()
	defer b.host.Close()
	done := make(chan struct{}, 2)
	go func() { p.toGuest(b); done <- struct{}{} }()
	go func() { p.toPlatform(b); done <- struct{}{} }()
	var tick <-chan time.Time
	if idleMS > 0 {
		idle := time.Duration(idleMS) * time.Millisecond
		t := time.NewTicker(max(min(idle/4, time.Second), 10*time.Millisecond))
		defer t.Stop()
		tick = t.C
		for finished := 0; finished < 2; {
			select {
			case <-done:
				finished++
			case <-tick:
				if time.Since(time.Unix(0, b.last.Load())) >= idle {
					p.reaped.Add(1)
					p.log.Info("data plane: reaped an idle connection", "conn", b.id, "data_idle_ms", idleMS)
					b.end(fmt.Sprintf("idle for %d ms (data_idle_ms)", idleMS))
					<-done
					<-done
					return
				}
			}
		}
		return
	}
	<-done
	<-done
}

// toGuest copies the platform's bytes into the stream. A stream write
// waits for the guest's credit, so a tenant that stops reading stops
// this copy and, through the socket's buffer, the platform's writer.
func (p *Planes) toGuest(b *bridge) {
	buf := make([]byte, bufSize)
	for {
		n, err := b.host.Read(buf)
		if n > 0 {
			b.held.Add(int64(n))
			b.touch()
			if !p.waitThawed() {
				b.held.Add(-int64(n))
				b.end("the sandbox is stopping")
				return
			}
			_, werr := b.stream.Write(buf[:n])
			b.held.Add(-int64(n))
			if werr != nil {
				b.end("the guest's end is gone")
				return
			}
			if p.cfg.In != nil {
				p.cfg.In(n)
			}
			p.active()
		}
		if errors.Is(err, io.EOF) {
			b.stream.CloseWrite(nil)
			if hungUp(b.host) {
				// Not a half-close: the platform closed its whole
				// connection, so nobody will read the tenant's answer.
				// The tenant gets a moment to read what came, and the
				// slot is freed even if its server never closes.
				time.AfterFunc(closeGrace, func() { b.end("the platform closed the connection") })
			}
			return
		}
		if err != nil {
			b.end("the platform's connection failed")
			return
		}
	}
}

// closeGrace is how long a connection whose platform end closed whole
// waits for the guest's end to finish before it is reset.
const closeGrace = time.Second

// hungUp tells a platform that closed its connection from one that only
// shut its writing half: on a Unix stream socket, poll reports POLLHUP
// only once the peer has shut both directions (or is gone).
func hungUp(c *net.UnixConn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return true
	}
	hup := false
	rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 0); err == nil && n == 1 {
			hup = fds[0].Revents&unix.POLLHUP != 0
		}
	})
	return hup
}

// toPlatform copies the guest's bytes to the platform, through the rate
// cap. The stream grants the guest credit as it is read, and it is read
// only as fast as the platform takes the bytes (and the cap allows), so
// a slow platform slows the tenant and nothing is dropped.
func (p *Planes) toPlatform(b *bridge) {
	var r io.Reader = b.stream
	if p.rate != nil {
		r = &pace.Reader{R: b.stream, B: p.rate, Ctx: p.ctx}
	}
	buf := make([]byte, bufSize)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			b.held.Add(int64(n))
			b.touch()
			_, werr := b.host.Write(buf[:n])
			b.held.Add(-int64(n))
			if werr != nil {
				b.end("the platform's connection failed")
				return
			}
			if p.cfg.Out != nil {
				p.cfg.Out(n)
			}
			p.active()
		}
		if errors.Is(err, io.EOF) {
			b.host.CloseWrite()
			return
		}
		if err != nil {
			b.end("the guest's end failed")
			return
		}
	}
}

func (p *Planes) active() {
	if p.cfg.Active != nil {
		p.cfg.Active()
	}
}
