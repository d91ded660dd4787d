// Package controltest runs a scripted stand-in for nether's control
// socket, for the tests of the packages that talk to one (client and
// nether-ctl). It speaks only the wire: what a line gets back, byte for
// byte, is up to the test, so a test can send replies nether itself never
// would (v1 bare lines, malformed trailers, a connection cut mid-frame).
//
// The real server is tested against a fake backend in package control;
// this package fakes the server instead, so it builds wherever the client
// does.
package controltest

import (
	"bufio"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/nethersandbox/nether/internal/frame"
)

// SocketPath returns a fresh socket path in a directory removed when the
// test ends. It is kept short because sun_path is small (108 bytes on
// Linux, 104 on macOS) and t.TempDir can be longer than that.
func SocketPath(t testing.TB) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.sock")
	if len(p) >= 100 {
		d, err := os.MkdirTemp("", "nctl")
		if err != nil {
			t.Fatalf("controltest: making a short socket directory: %v", err)
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		p = filepath.Join(d, "c.sock")
	}
	return p
}

// Handler answers one line, given without its "\n", by writing raw wire
// bytes to w. Returning false closes the connection.
type Handler func(line string, w io.Writer) bool

// Server is a scripted control socket.
type Server struct {
	// Info is the body of the __info__ report, the handshake every client
	// performs first; it is answered framed with exit 0. When empty,
	// __info__ goes to Handle like any other line.
	Info string
	// Handle answers every other line. When nil, lines get no reply.
	Handle Handler
	// Refuse, when set, is written as soon as a client connects, and the
	// connection is then closed without reading: how nether turns a
	// client away (too many clients, another user).
	Refuse []byte
}

// Start serves s on a fresh socket until the test ends and returns the
// socket's path. Cleanup closes the listener and every connection and
// waits for the handlers to return.
func (s Server) Start(t testing.TB) string {
	t.Helper()
	sock := SocketPath(t)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatalf("controltest: listening on %s: %v", sock, err)
	}
	var (
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
		wg    sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // the listener closed at cleanup
			}
			mu.Lock()
			conns[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() {
					mu.Lock()
					delete(conns, c)
					mu.Unlock()
					c.Close()
				}()
				s.serveConn(c)
			}()
		}
	}()
	return sock
}

func (s Server) serveConn(c net.Conn) {
	if s.Refuse != nil {
		c.Write(s.Refuse)
		return
	}
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "__info__" && s.Info != "" {
			if _, err := c.Write(frame.Framed(s.Info, 0)); err != nil {
				return
			}
			continue
		}
		if s.Handle != nil && !s.Handle(line, c) {
			return
		}
	}
}

// Replies is a Handler that answers each line in replies with its bytes,
// and any other line with otherwise(line) (no reply when otherwise is
// nil).
func Replies(replies map[string][]byte, otherwise func(line string) []byte) Handler {
	return func(line string, w io.Writer) bool {
		r, ok := replies[line]
		if !ok && otherwise != nil {
			r = otherwise(line)
		}
		if len(r) > 0 {
			w.Write(r)
		}
		return true
	}
}
