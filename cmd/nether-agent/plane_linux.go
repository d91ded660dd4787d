package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// The agent is the data planes' forwarder in the guest. A data-plane
// connection arrives as an OpConnect stream, which the agent splices to
// the tenant's ordinary server on 127.0.0.1:<app_port>; a tenant's
// outbound connection to 127.0.0.1:<egress_port> leaves as an OpEgress
// stream. Both live in guest memory, so a fork or a woken park has them
// already running, and an egress stream in the middle of a recv() sleeps
// through a park with its process.

// dialTimeout bounds a data-plane connect to the tenant's server: a
// loopback connect either succeeds or is refused at once, unless the
// server's accept queue is full.
const dialTimeout = 5 * time.Second

// connect serves OpConnect: one data-plane connection to the tenant.
func (a *agent) connect(s *channel.Stream, req agentproto.Request) {
	if req.Port == 0 {
		s.Reset("connect: no port")
		return
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(req.Port)))
	c, err := net.DialTimeout("tcp4", addr, dialTimeout)
	if err != nil {
		s.Reset("connecting to the tenant's server: " + err.Error())
		return
	}
	splice(s, c.(*net.TCPConn))
}

// splice copies between a stream and a tenant's TCP connection until both
// directions end. An orderly end on one side is passed on as one (a
// half-close); an error on either side resets the stream and closes the
// connection.
func splice(s *channel.Stream, c *net.TCPConn) {
	defer c.Close()
	var once sync.Once
	fail := func(why string) { once.Do(func() { s.Reset(why); c.SetLinger(0); c.Close() }) }
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Tenant -> host. Stream writes wait for credit, which the host
		// grants only as it delivers: a host-side consumer that stops
		// reading stops this copy, and the tenant's socket fills.
		// Reads as large as the tenant's socket holds, up to 256 KiB:
		// the stream cuts them into frames, and with the channel's bulk
		// lane a large write goes out as one batch.
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if _, werr := s.Write(buf[:n]); werr != nil {
					fail("the host end is gone")
					return
				}
			}
			if errors.Is(err, io.EOF) {
				s.CloseWrite([]byte("ok"))
				return
			}
			if err != nil {
				fail("the tenant's connection failed: " + err.Error())
				return
			}
		}
	}()
	// Host -> tenant.
	if _, err := io.Copy(c, s); err != nil {
		fail("delivering to the tenant: " + err.Error())
	} else {
		c.CloseWrite()
	}
	<-done
}

// egressListener is the guest end of the egress plane.
type egressListener struct {
	mu   sync.Mutex
	port uint16
	ln   net.Listener
}

// listen serves OpListen: the egress listener moves to req.Port (0 closes
// it). Connections already made keep going.
func (a *agent) listen(s *channel.Stream, req agentproto.Request) {
	e := &a.egress
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ln != nil && e.port == req.Port {
		s.CloseWrite([]byte("ok " + strconv.Itoa(int(req.Port))))
		return
	}
	if e.ln != nil {
		e.ln.Close()
		e.ln, e.port = nil, 0
	}
	if req.Port != 0 {
		ln, err := net.Listen("tcp4", net.JoinHostPort("127.0.0.1", strconv.Itoa(int(req.Port))))
		if err != nil {
			s.Reset("egress listener: " + err.Error())
			return
		}
		e.ln, e.port = ln, req.Port
		go a.acceptEgress(ln)
	}
	s.CloseWrite([]byte("ok " + strconv.Itoa(int(req.Port))))
}

// acceptEgress opens a stream for each tenant connection until the
// listener closes.
func (a *agent) acceptEgress(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return
		}
		go a.egressConn(c.(*net.TCPConn))
	}
}

func (a *agent) egressConn(c *net.TCPConn) {
	id, err := newConnID()
	if err != nil {
		a.log.Error("agent: egress connection id", "err", err)
		c.Close()
		return
	}
	s, err := a.mux.Open(agentproto.Request{Op: agentproto.OpEgress, Conn: id}.Encode())
	if err != nil {
		c.Close()
		return
	}
	splice(s, c)
}

// newConnID mints an egress connection id: 64 random bits, so the
// connections of forks of one base never share one by chance.
func newConnID() (string, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("reading random bytes: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
