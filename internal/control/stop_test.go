package control

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

const stopSigterm = "ERR sandbox stopping: sigterm\n\x1e-1\n"

// stopAsync calls Stop in the background; the channel yields how long it
// took.
func (h *harness) stopAsync(reason string) <-chan time.Duration {
	took := make(chan time.Duration, 1)
	go func() {
		t0 := time.Now()
		h.s.Stop(reason)
		took <- time.Since(t0)
	}()
	return took
}

// waitStopped waits for a Stop started by stopAsync to return, and checks
// it returned within bound.
func waitStopped(t *testing.T, took <-chan time.Duration, bound time.Duration) {
	t.Helper()
	select {
	case d := <-took:
		if d > bound {
			t.Errorf("Stop took %s, want at most %s", d, bound)
		}
	case <-time.After(bound + 5*time.Second):
		t.Fatalf("Stop did not return")
	}
}

// nextReply reads one frame and returns it as wire bytes.
func (c *conn) nextReply(within time.Duration) string {
	c.t.Helper()
	body, exit := c.readFrame(within)
	return framed(string(body), exit)
}

// closedAfter checks that nothing but end-of-file follows.
func (c *conn) closedAfter(within time.Duration) {
	c.t.Helper()
	rest, closed := c.readUntilClosed(within)
	if !closed {
		c.t.Fatalf("the connection was not closed (read %q)", rest)
	}
	if len(rest) > 0 {
		c.t.Fatalf("bytes after the last reply: %q", rest)
	}
}

// never is a gate that stays shut for the test, then opens so the
// goroutines it held can end.
func never(t *testing.T) chan struct{} {
	g := make(chan struct{})
	t.Cleanup(func() { close(g) })
	return g
}

// deafBackend makes fb's blocked calls ignore their context until the test
// ends.
func deafBackend(t *testing.T, fb *fakeBackend) {
	fb.mu.Lock()
	fb.deaf = never(t)
	fb.mu.Unlock()
}

// blockedCall starts a server whose backend blocks its calls until their
// context ends (deaf: even past it), sends line from a new client and
// returns once the backend's method has been called.
func blockedCall(t *testing.T, line, method string, deaf bool, tune func(*Server)) (*fakeBackend, *harness, *conn) {
	t.Helper()
	fb := newFake()
	fb.up()
	fb.block = true
	if deaf {
		deafBackend(t, fb)
	}
	h := start(t, fb, 0, tune)
	c := h.dial(t)
	c.send(line)
	waitFor(t, method+" to start", 5*time.Second, func() bool { return len(fb.contexts(method)) == 1 })
	return fb, h, c
}

// stopCause checks that ctx was cancelled by Stop, with its ERR line as
// the cause.
func stopCause(t *testing.T, what string, ctx context.Context, want string) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: its context was not cancelled by Stop", what)
	}
	if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), want) {
		t.Fatalf("%s: context cause %v, want one containing %q", what, cause, want)
	}
}

// Every command in flight when the sandbox stops is answered with a
// framed ERR before its client is closed.
func TestStopAnswersInFlight(t *testing.T) {
	const bound = 2 * time.Second // far above what Stop needs when every client reads

	for _, deaf := range []bool{false, true} {
		name := "output honours its context"
		if deaf {
			name = "output blocks forever"
		}
		t.Run("shell mid-stream: "+name, func(t *testing.T) {
			fb := newFake()
			fb.up()
			h := start(t, fb, 0, nil)
			fb.on("long", script{chunks: [][]byte{[]byte("start\n"), []byte("never")}, gate: never(t), gateAt: 1, deaf: deaf, status: "0"})
			c := h.dial(t)
			c.send("long")
			c.readUntil("start\n", 5*time.Second)
			took := h.stopAsync("sigterm")
			if got := c.nextReply(5 * time.Second); got != "\n"+stopSigterm {
				t.Fatalf("the streaming command: %q, want %q", got, "\n"+stopSigterm)
			}
			c.closedAfter(5 * time.Second)
			waitStopped(t, took, bound)
			stopCause(t, "Exec", fb.contexts("Exec")[0], "sandbox stopping: sigterm")
		})

		t.Run("shell before any output: "+name, func(t *testing.T) {
			fb := newFake()
			fb.up()
			h := start(t, fb, 0, nil)
			fb.on("silent", script{chunks: [][]byte{[]byte("never")}, gate: never(t), gateAt: 0, deaf: deaf, status: "0"})
			c := h.dial(t)
			c.send("silent")
			fb.output(t, "silent", 0)
			took := h.stopAsync("sigterm")
			if got := c.nextReply(5 * time.Second); got != stopSigterm {
				t.Fatalf("the silent command: %q, want %q", got, stopSigterm)
			}
			c.closedAfter(5 * time.Second)
			waitStopped(t, took, bound)
		})

		for _, line := range []string{"__put__ a b", "__get__ a b"} {
			t.Run(line+" blocked: "+name, func(t *testing.T) {
				method := map[string]string{"__put__ a b": "Put", "__get__ a b": "Get"}[line]
				fb, h, c := blockedCall(t, line, method, deaf, nil)
				took := h.stopAsync("sigterm")
				if got := c.nextReply(5 * time.Second); got != stopSigterm {
					t.Fatalf("the blocked transfer: %q, want %q", got, stopSigterm)
				}
				c.closedAfter(5 * time.Second)
				waitStopped(t, took, bound)
				stopCause(t, method, fb.contexts(method)[0], "sandbox stopping: sigterm")
			})
		}

		t.Run("waiting for the agent of a failed start: "+name, func(t *testing.T) {
			fb := newFake() // the agent never connects
			if deaf {
				deafBackend(t, fb)
			}
			h := start(t, fb, 0, func(s *Server) { s.AgentWait = time.Minute })
			c := h.dial(t)
			c.send("echo waits")
			c.send("__put__ a b")
			waitFor(t, "the command to wait for the agent", 5*time.Second, func() bool { return fb.waitCalls.Load() == 1 })
			took := h.stopAsync("restore failed: bad magic")
			const want = "ERR sandbox stopping: restore failed: bad magic\n\x1e-1\n"
			for i := range 2 {
				if got := c.nextReply(5 * time.Second); got != want {
					t.Fatalf("reply %d: %q, want %q", i, got, want)
				}
			}
			c.closedAfter(5 * time.Second)
			waitStopped(t, took, bound)
			if n := fb.execCount(); n != 0 || fb.putCalls.Load() != 0 {
				t.Fatalf("work ran without an agent: %d execs, %d puts", n, fb.putCalls.Load())
			}
			stopCause(t, "WaitAgent", fb.contexts("WaitAgent")[0], "restore failed: bad magic")
		})
	}

	t.Run("commands queued behind the running one", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, nil)
		fb.on("long", script{chunks: [][]byte{[]byte("start\n"), []byte("never")}, gate: never(t), gateAt: 1, deaf: true, status: "0"})
		c := h.dial(t)
		c.send("long")
		c.readUntil("start\n", 5*time.Second)
		c.send("echo queued")
		c.send("__put__ a b")
		c.send("__snapshot__ s")
		waitFor(t, "the queue to fill", 5*time.Second, func() bool { return h.queued() == 3 })
		took := h.stopAsync("sigterm")
		for i, want := range []string{"\n" + stopSigterm, stopSigterm, stopSigterm, stopSigterm} {
			if got := c.nextReply(5 * time.Second); got != want {
				t.Fatalf("reply %d: %q, want %q", i, got, want)
			}
		}
		c.closedAfter(5 * time.Second)
		waitStopped(t, took, bound)
		if n := fb.execCount(); n != 1 || fb.putCalls.Load() != 0 || len(fb.contexts("Snapshot")) != 0 {
			t.Fatalf("queued work ran: %d execs, %d puts, %d snapshots", n, fb.putCalls.Load(), len(fb.contexts("Snapshot")))
		}
	})

	t.Run("lines sent just before the stop, read or not", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, nil)
		fb.on("long", script{chunks: [][]byte{[]byte("start\n"), []byte("never")}, gate: never(t), gateAt: 1, deaf: true, status: "0"})
		c := h.dial(t)
		c.send("long")
		c.readUntil("start\n", 5*time.Second)
		const n = 20
		for i := range n {
			c.send(fmt.Sprintf("echo %d", i))
		}
		h.s.Stop("sigterm") // at once: the server may not have read them yet
		if got := c.nextReply(5 * time.Second); got != "\n"+stopSigterm {
			t.Fatalf("the running command: %q", got)
		}
		for i := range n {
			if got := c.nextReply(5 * time.Second); got != stopSigterm {
				t.Fatalf("queued command %d: %q, want %q", i, got, stopSigterm)
			}
		}
		c.closedAfter(5 * time.Second)
	})

	t.Run("a capture is answered but left to the session", func(t *testing.T) {
		fb, h, c := blockedCall(t, "__snapshot__ s", "Snapshot", false, nil)
		took := h.stopAsync("sigterm")
		if got := c.nextReply(5 * time.Second); got != stopSigterm {
			t.Fatalf("the capture: %q, want %q", got, stopSigterm)
		}
		c.closedAfter(5 * time.Second)
		waitStopped(t, took, bound)
		ctx := fb.contexts("Snapshot")[0]
		if ctx.Err() != nil {
			t.Fatal("Stop cancelled the capture; whether it commits is the session's call")
		}
		h.cancel() // the session gives up on it
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the capture's context does not end with the root context")
		}
	})

	t.Run("idle clients and observers just see the connection close", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, nil)
		a := h.dial(t)
		if got := a.roundTrip("echo done"); got != framed("ran echo done\n", "0") {
			t.Fatalf("before the stop: %q", got)
		}
		b := h.dial(t)
		b.roundTrip("__info__")
		waitStopped(t, h.stopAsync("sigterm"), bound)
		a.closedAfter(5 * time.Second)
		b.closedAfter(5 * time.Second)
	})

	t.Run("the reason is one bounded line", func(t *testing.T) {
		_, h, c := blockedCall(t, "__put__ a b", "Put", false, nil)
		h.s.Stop("restore failed:\x1e-1\nforged\x00 " + strings.Repeat("x", 1000))
		got := c.nextReply(5 * time.Second)
		want := "ERR sandbox stopping: restore failed: -1 forged  " + strings.Repeat("x", stopReasonMax-len("restore failed: -1 forged  ")) + "...\n\x1e-1\n"
		if got != want {
			t.Fatalf("reply %q\nwant %q", got, want)
		}
		c.closedAfter(5 * time.Second)
	})

	t.Run("Close stops with a generic reason", func(t *testing.T) {
		_, h, c := blockedCall(t, "__get__ a b", "Get", false, nil)
		h.s.Close()
		if got, want := c.nextReply(5*time.Second), "ERR sandbox stopping: nether is stopping\n\x1e-1\n"; got != want {
			t.Fatalf("reply %q, want %q", got, want)
		}
		c.closedAfter(5 * time.Second)
	})
}

// queued is how many commands the server's clients have queued and not
// started.
func (h *harness) queued() int {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	n := 0
	for c := range h.s.clients {
		n += len(c.work)
	}
	return n
}

func TestStopLifecycle(t *testing.T) {
	t.Run("stops accepting, removes the socket, ends Serve", func(t *testing.T) {
		fb := newFake()
		h := start(t, fb, 0, nil)
		h.dial(t).roundTrip("__info__")
		h.s.Stop("sigterm")
		select {
		case <-h.served:
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return after Stop")
		}
		if _, err := os.Lstat(h.path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket file left after Stop: %v", err)
		}
		if c, err := net.DialTimeout("unix", h.path, time.Second); err == nil {
			c.Close()
			t.Fatal("the socket still accepts connections after Stop")
		}
	})

	t.Run("a client that does not read does not hold Stop up", func(t *testing.T) {
		fb := newFake()
		fb.up()
		const stopWait = 300 * time.Millisecond
		h := start(t, fb, 0, func(s *Server) { s.StopWait = stopWait }) // WedgedAfter stays 5s
		fb.on("flood", script{chunks: repeatChunks(pattern(0, 64<<10), 256), status: "0"})
		c := h.dial(t)
		c.send("flood") // ... and never read
		out := fb.output(t, "flood", 0)
		waitFor(t, "the socket buffer to fill", 5*time.Second, func() bool { return out.served.Load() >= 2 })
		time.Sleep(200 * time.Millisecond) // the relay is now blocked in a write
		if n := out.served.Load(); n >= 256 {
			t.Fatalf("all %d chunks went out; the client never blocked the relay", n)
		}
		took := h.stopAsync("sigterm")
		waitStopped(t, took, stopWait+time.Second)
		if _, closed := c.readUntilClosed(10 * time.Second); !closed {
			t.Fatal("the client that did not read was not closed")
		}
	})

	t.Run("a second Stop waits for the first; Close after Stop is harmless", func(t *testing.T) {
		const stopWait = 300 * time.Millisecond
		_, h, c := blockedCall(t, "__put__ a b", "Put", true, func(s *Server) { s.StopWait = stopWait })
		first := h.stopAsync("sigterm")
		waitFor(t, "the first Stop to begin", 5*time.Second, func() bool { _, ok := h.s.stopText(); return ok })
		second := h.stopAsync("ignored")
		waitStopped(t, first, stopWait+time.Second)
		waitStopped(t, second, stopWait+time.Second)
		h.s.Close()
		if got := c.nextReply(5 * time.Second); got != stopSigterm {
			t.Fatalf("reply %q, want %q", got, stopSigterm)
		}
	})

	t.Run("Stop before Serve", func(t *testing.T) {
		s := New(quietLog(), newFake(), nil, 0)
		path := sockPath(t)
		if err := s.Listen(path); err != nil {
			t.Fatal(err)
		}
		s.Stop("failed before serving")
		done := make(chan struct{})
		go func() { s.Serve(context.Background()); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Serve after Stop did not return")
		}
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket file left: %v", err)
		}
	})
}
