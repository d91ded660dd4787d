package control

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/frame"
)

const notReady = "ERR agent not connected (guest not ready)\n\x1e-1\n"

// pattern returns n bytes of a-z starting at offset off of an endless
// abc... stream, so a truncated body shows exactly where it was cut.
func pattern(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + (off+i)%26)
	}
	return b
}

// chunked splits pattern(0, sum(sizes)) into chunks of the given sizes.
func chunked(sizes ...int) [][]byte {
	var out [][]byte
	off := 0
	for _, n := range sizes {
		out = append(out, pattern(off, n))
		off += n
	}
	return out
}

func repeatChunks(chunk []byte, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = chunk
	}
	return out
}

// 1. Readiness.
func TestReadiness(t *testing.T) {
	t.Run("agent never connects", func(t *testing.T) {
		fb := newFake()
		h := start(t, fb, 0, func(s *Server) { s.AgentWait = 200 * time.Millisecond })
		c := h.dial(t)
		for _, line := range []string{"echo hi", "__put__ a b", "__get__ a b"} {
			t0 := time.Now()
			got := c.roundTrip(line)
			el := time.Since(t0)
			if got != notReady {
				t.Fatalf("%q: got %q, want %q", line, got, notReady)
			}
			if el < 200*time.Millisecond || el > 5*time.Second {
				t.Errorf("%q: failed after %s, want after the 200ms AgentWait (and bounded)", line, el)
			}
		}
		if n := fb.execCount(); n != 0 {
			t.Errorf("Exec called %d times without an agent", n)
		}
		if fb.putCalls.Load()+fb.getCalls.Load() != 0 {
			t.Errorf("Put/Get called without an agent")
		}
		// The connection stays usable.
		if got := c.roundTrip("__help__"); !strings.HasPrefix(got, "proto_version=2\n") {
			t.Errorf("__help__ after the failure: %q", trunc(got))
		}
	})

	t.Run("queries answer while a command waits", func(t *testing.T) {
		fb := newFake()
		h := start(t, fb, 0, func(s *Server) { s.AgentWait = 30 * time.Second })
		c := h.dial(t)
		c.send("echo hi")
		waitFor(t, "the command to park in WaitAgent", 5*time.Second, func() bool { return fb.waitCalls.Load() == 1 })
		for _, q := range []struct{ line, prefix string }{
			{"__info__", fb.Info()},
			{"__stats__", "uptime_ms="},
			{"__help__", "proto_version=2\n"},
		} {
			c.send(q.line)
			// Far below the 30s AgentWait: the query must not queue
			// behind the parked command.
			body, exit := c.readFrame(3 * time.Second)
			if exit != "0" || !strings.HasPrefix(string(body), q.prefix) {
				t.Fatalf("%s while waiting: got %q exit %q", q.line, trunc(string(body)), exit)
			}
		}
		if n := fb.execCount(); n != 0 {
			t.Fatalf("Exec ran before the agent was up (%d)", n)
		}
		fb.up()
		body, exit := c.readFrame(5 * time.Second)
		if got := framed(string(body), exit); got != framed("ran echo hi\n", "0") {
			t.Fatalf("the parked command after the agent came up: %q", got)
		}
	})
}

// 2. Exit clamp.
func TestExitClamp(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	for i, tc := range []struct{ status, want string }{
		{"0", "0"},
		{"1", "1"},
		{"255", "255"},
		{"42", "42"},
		{"-1", "255"},
		{"-0", "255"},
		{"256", "255"},
		{"999", "255"},
		{"abc", "255"},
		{"", "255"},
		{"007", "255"},
		{"00", "255"},
		{" 1", "255"},
		{"1 ", "255"},
		{"+1", "255"},
		{"1\n", "255"},
		{"12345678901234567890", "255"},
		{"\x1e0", "255"},
	} {
		t.Run(fmt.Sprintf("%q", tc.status), func(t *testing.T) {
			cmd := fmt.Sprintf("status-%d", i)
			fb.on(cmd, script{chunks: [][]byte{[]byte("out\n")}, status: tc.status})
			got := c.roundTrip(cmd)
			if want := framed("out\n", tc.want); got != want {
				t.Fatalf("status %q: got %q, want %q", tc.status, got, want)
			}
		})
	}
	// Nothing trailed a trailer: the next reply starts exactly at its body.
	if got := c.roundTrip("echo last"); got != framed("ran echo last\n", "0") {
		t.Fatalf("reply after the clamp cases: %q", got)
	}
}

// 3. Output framing.
func TestOutputEscaping(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	chunks := [][]byte{
		[]byte("a\x1e5\n"),    // would forge an early trailer unescaped
		[]byte("\x1f"),        // an escape lead alone at a chunk end
		[]byte("b\x1e"),       // a delimiter at a chunk end
		[]byte("\x1e\x1f-\n"), // back to back
	}
	fb.on("hostile", script{chunks: chunks, status: "3"})
	c := h.dial(t)
	got := c.roundTrip("hostile")
	wantBody := "a\x1f^5\n" + "\x1f_" + "b\x1f^" + "\x1f^\x1f_-\n"
	if want := framed(wantBody, "3"); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	if n := strings.Count(got, "\x1e"); n != 1 || !strings.HasSuffix(got, "\x1e3\n") {
		t.Fatalf("%d raw 0x1e in the reply, want exactly the trailer's", n)
	}
	var u frame.Unescaper
	if plain := u.Append(nil, []byte(wantBody)); !bytes.Equal(plain, bytes.Join(chunks, nil)) {
		t.Fatalf("un-escaped body %q does not round-trip", plain)
	}
	if got := c.roundTrip("echo next"); got != framed("ran echo next\n", "0") {
		t.Fatalf("next reply desynchronised: %q", got)
	}
}

// 4. Output cap.
func TestOutputCap(t *testing.T) {
	const marker = "\n...[output capped]\n"
	big := repeatChunks(pattern(0, 64<<10), 24) // 1.5 MiB, more than the 1 MiB default
	for _, tc := range []struct {
		name     string
		maxOut   int64
		chunks   [][]byte
		wantBody string
	}{
		{"several chunks", 1000, chunked(300, 900, 1800, 2000), string(pattern(0, 1000)) + marker},
		{"first chunk fills the cap", 1000, chunked(1000, 4000), string(pattern(0, 1000)) + marker},
		{"one big chunk", 1000, chunked(5000), string(pattern(0, 1000)) + marker},
		{"one byte over", 1000, chunked(999, 1, 1), string(pattern(0, 1000)) + marker},
		{"exactly the cap", 1000, chunked(400, 600), string(pattern(0, 1000))},
		{"unlimited", 0, chunked(300, 900, 1800, 2000), string(pattern(0, 5000))},
		{"unlimited beyond the default", 0, big, string(bytes.Join(big, nil))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := newFake()
			fb.up()
			h := start(t, fb, tc.maxOut, nil)
			fb.on("spew", script{chunks: tc.chunks, status: "3"})
			c := h.dial(t)
			got := c.roundTrip("spew")
			if want := framed(tc.wantBody, "3"); got != want {
				t.Fatalf("got %d bytes %q\nwant %d bytes %q", len(got), trunc(got[max(0, len(got)-60):]), len(want), trunc(want[max(0, len(want)-60):]))
			}
			wantMarkers := strings.Count(tc.wantBody, "[output capped]")
			if n := strings.Count(got, "[output capped]"); n != wantMarkers {
				t.Fatalf("%d cap markers, want %d", n, wantMarkers)
			}
			waitDrained(t, fb.output(t, "spew", 0), 5*time.Second)
			if got := c.roundTrip("echo next"); got != framed("ran echo next\n", "0") {
				t.Fatalf("next reply after a capped one: %q", got)
			}
		})
	}
}

// 5. Observer.
func TestObserver(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	a := h.dial(t)
	if got := a.roundTrip("echo a"); got != framed("ran echo a\n", "0") {
		t.Fatalf("primary: %q", got)
	}
	b := h.dial(t)
	checkObserver := func(t *testing.T, c *conn) {
		t.Helper()
		for _, line := range []string{"echo hi", "__put__ a b", "__get__ a b", "__shutdown__"} {
			got := c.roundTrip(line)
			if !strings.HasPrefix(got, "ERR read-only observer: ") || !strings.HasSuffix(got, "\n\x1e-1\n") || strings.Count(got, "\x1e") != 1 {
				t.Errorf("observer %q: got %q", line, got)
			}
		}
		if got, want := c.roundTrip("__info__"), framed(fb.Info(), "0"); got != want {
			t.Errorf("observer __info__: %q, want %q", got, want)
		}
		if got := c.roundTrip("__stats__"); !strings.HasPrefix(got, "uptime_ms=") || !strings.HasSuffix(got, "\x1e0\n") {
			t.Errorf("observer __stats__: %q", got)
		}
		if got := c.roundTrip("__help__"); !strings.HasPrefix(got, "proto_version=2\n") || !strings.HasSuffix(got, "\x1e0\n") {
			t.Errorf("observer __help__: %q", trunc(got))
		}
	}
	checkObserver(t, b)
	if n := fb.execCount(); n != 1 {
		t.Errorf("Exec ran %d times, want 1 (the primary's)", n)
	}
	if fb.putCalls.Load() != 0 || fb.getCalls.Load() != 0 || fb.shutdowns.Load() != 0 {
		t.Errorf("an observer reached the backend: put=%d get=%d shutdown=%d", fb.putCalls.Load(), fb.getCalls.Load(), fb.shutdowns.Load())
	}

	// The primary leaves: the existing observer stays an observer, the
	// next new connection is the primary, and the one after observes.
	a.c.Close()
	waitFor(t, "the primary slot to be released", 5*time.Second, h.primaryFree)
	checkObserver(t, b)
	c := h.dial(t)
	if got := c.roundTrip("echo c"); got != framed("ran echo c\n", "0") {
		t.Fatalf("new connection after the primary left: %q", got)
	}
	if got := c.roundTrip("__put__ x y"); got != framed("OK put 42 bytes\n", "0") {
		t.Fatalf("new primary __put__: %q", got)
	}
	d := h.dial(t)
	checkObserver(t, d)
	checkObserver(t, b)
}

// 6. Wedged primary.
func TestWedgedPrimary(t *testing.T) {
	t.Run("non-reader is dropped and the output drained", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, func(s *Server) { s.WedgedAfter = 300 * time.Millisecond })
		const chunk, nChunks = 64 << 10, 64 // 4 MiB
		fb.on("flood", script{chunks: repeatChunks(pattern(0, chunk), nChunks), status: "0"})
		a := h.dial(t)
		a.roundTrip("__help__") // admitted as primary
		t0 := time.Now()
		a.send("flood") // ... and never read
		out := fb.output(t, "flood", 0)
		waitDrained(t, out, 15*time.Second)
		if el := time.Since(t0); el > 10*time.Second {
			t.Errorf("draining took %s", el)
		}
		got, closed := a.readUntilClosed(10 * time.Second)
		if !closed {
			t.Fatalf("the wedged client's connection was not closed (read %d bytes)", len(got))
		}
		if len(got) >= chunk*nChunks {
			t.Fatalf("the wedged client got all %d bytes; it was never blocked", len(got))
		}
		waitFor(t, "the primary slot to be released", 5*time.Second, h.primaryFree)
		b := h.dial(t)
		if got := b.roundTrip("echo b"); got != framed("ran echo b\n", "0") {
			t.Fatalf("new primary after the drop: %q", got)
		}
	})

	t.Run("slow reader is not dropped", func(t *testing.T) {
		fb := newFake()
		fb.up()
		// The whole reply takes several WedgedAfter periods to read, but no
		// single write waits anywhere near that long.
		h := start(t, fb, 0, func(s *Server) { s.WedgedAfter = 500 * time.Millisecond })
		const total = 1 << 20
		fb.on("flood", script{chunks: repeatChunks(pattern(0, 64<<10), total/(64<<10)), status: "0"})
		a := h.dial(t)
		a.send("flood")
		buf := make([]byte, 16<<10)
		var got int
		t0 := time.Now()
		for {
			a.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			n, err := a.br.Read(buf)
			got += n
			if i := bytes.IndexByte(buf[:n], 0x1e); i >= 0 {
				got -= n - i
				break
			}
			if err != nil {
				t.Fatalf("slow reader: %v after %d bytes and %s", err, got, time.Since(t0))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got != total {
			t.Fatalf("slow reader got %d body bytes, want %d", got, total)
		}
	})
}

// readUntil reads raw bytes until want has arrived.
func (c *conn) readUntil(want string, within time.Duration) string {
	c.t.Helper()
	c.c.SetReadDeadline(time.Now().Add(within))
	defer c.c.SetReadDeadline(time.Time{})
	var b []byte
	for !bytes.HasSuffix(b, []byte(want)) {
		x, err := c.br.ReadByte()
		if err != nil {
			c.t.Fatalf("waiting for %q: %v (got %q)", want, err, b)
		}
		b = append(b, x)
	}
	return string(b)
}

// 7. Frame boundary interlock.
func TestBoundaryInterlock(t *testing.T) {
	t.Run("query waits for the trailer", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, func(s *Server) { s.BoundaryWait = 2 * time.Second })
		var chunks [][]byte
		for i := range 5 {
			chunks = append(chunks, []byte(fmt.Sprintf("chunk-%d\n", i)))
		}
		fb.on("stream", script{chunks: chunks, delay: 100 * time.Millisecond, status: "7"})
		c := h.dial(t)
		c.send("stream")
		if got := c.readUntil("chunk-0\n", 5*time.Second); got != "chunk-0\n" {
			t.Fatalf("stream start: %q", got)
		}
		c.send("__stats__") // mid-frame
		body, exit := c.readFrame(10 * time.Second)
		if string(body) != "chunk-1\nchunk-2\nchunk-3\nchunk-4\n" || exit != "7" {
			t.Fatalf("the command's frame was interrupted: body %q exit %q", body, exit)
		}
		body, exit = c.readFrame(10 * time.Second)
		if !strings.HasPrefix(string(body), "uptime_ms=") || exit != "0" || bytes.ContainsAny(body, "\x1e\x1f") {
			t.Fatalf("stats after the trailer: body %q exit %q", body, exit)
		}
	})

	t.Run("wait is bounded", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, func(s *Server) { s.BoundaryWait = 50 * time.Millisecond })
		gate := make(chan struct{})
		fb.on("long", script{
			chunks: [][]byte{[]byte("chunk-0\n"), []byte("chunk-1\n"), []byte("chunk-2\n")},
			gate:   gate, gateAt: 1, status: "7",
		})
		c := h.dial(t)
		c.send("long")
		c.readUntil("chunk-0\n", 5*time.Second)
		c.send("__stats__")
		// The command cannot finish until the gate opens, so the stats
		// reply can only arrive now if the boundary wait gave up.
		body, exit := c.readFrame(5 * time.Second)
		if !strings.HasPrefix(string(body), "uptime_ms=") || exit != "0" {
			t.Fatalf("stats during a stalled stream: body %q exit %q", body, exit)
		}
		close(gate)
		body, exit = c.readFrame(5 * time.Second)
		if string(body) != "chunk-1\nchunk-2\n" || exit != "7" {
			t.Fatalf("rest of the command: body %q exit %q", body, exit)
		}
	})
}

// 8. Too many clients.
func TestTooManyClients(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, func(s *Server) { s.MaxClients = 2 })
	a, b := h.dial(t), h.dial(t)
	a.roundTrip("__help__")
	b.roundTrip("__help__")
	check := func(c *conn) {
		t.Helper()
		got, closed := c.readUntilClosed(5 * time.Second)
		if !closed {
			t.Fatalf("the refused connection was not closed (got %q)", got)
		}
		if s := string(got); !strings.HasPrefix(s, "ERR too many clients") || !strings.HasSuffix(s, "\n\x1e-1\n") || strings.Count(s, "\x1e") != 1 {
			t.Fatalf("refusal: %q", s)
		}
	}
	check(h.dial(t))
	// Also when the refused client speaks first. The server may already
	// have closed, so the write itself can fail with EPIPE; the refusal
	// must still be readable.
	c := h.dial(t)
	c.c.SetWriteDeadline(time.Now().Add(time.Second))
	c.c.Write([]byte("__info__\n"))
	check(c)
	if n := h.clientCount(); n != 2 {
		t.Fatalf("%d clients registered, want 2", n)
	}
	if got := a.roundTrip("echo a"); got != framed("ran echo a\n", "0") {
		t.Fatalf("the primary after the refusals: %q", got)
	}
	// A slot frees up when a client leaves.
	b.c.Close()
	waitFor(t, "the observer's slot to be released", 5*time.Second, func() bool { return h.clientCount() == 1 })
	d := h.dial(t)
	if got := d.roundTrip("__help__"); !strings.HasPrefix(got, "proto_version=2\n") {
		t.Fatalf("a client admitted after one left: %q", trunc(got))
	}
}

// 9. Socket rules.
func TestSocketRules(t *testing.T) {
	newServer := func() *Server { return New(quietLog(), newFake(), nil, 0) }

	t.Run("mode 0600", func(t *testing.T) {
		h := start(t, newFake(), 0, nil)
		fi, err := os.Lstat(h.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Fatalf("socket mode %v, want a 0600 socket", fi.Mode())
		}
	})

	t.Run("stale socket is replaced", func(t *testing.T) {
		path := sockPath(t)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false)
		ln.Close()
		if _, err := os.Lstat(path); err != nil {
			t.Fatalf("stale socket file not left behind: %v", err)
		}
		fb := newFake()
		fb.up()
		h := startOn(t, path, fb, 0, nil)
		if got := h.dial(t).roundTrip("echo x"); got != framed("ran echo x\n", "0") {
			t.Fatalf("the server on the replaced socket: %q", got)
		}
	})

	t.Run("live socket is refused", func(t *testing.T) {
		path := sockPath(t)
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := newServer()
		err = s.Listen(path)
		if err == nil {
			s.Close()
			t.Fatal("Listen took over a socket a live process serves")
		}
		if !strings.Contains(err.Error(), "running") {
			t.Errorf("error %q does not mention a running process", err)
		}
		// The live server keeps its socket.
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("the live listener lost its socket: %v", err)
		}
		c.Close()
	})

	for _, tc := range []struct {
		name string
		make func(t *testing.T, path string)
	}{
		{"regular file", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", func(t *testing.T, path string) {
			target := filepath.Join(filepath.Dir(path), "target")
			if err := os.WriteFile(target, []byte("precious"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			path := sockPath(t)
			tc.make(t, path)
			before, _ := os.Lstat(path)
			s := newServer()
			if err := s.Listen(path); err == nil {
				s.Close()
				t.Fatalf("Listen replaced a %s", tc.name)
			}
			after, err := os.Lstat(path)
			if err != nil || after.Mode() != before.Mode() {
				t.Fatalf("the %s was disturbed: %v %v", tc.name, after, err)
			}
			if tc.name != "directory" {
				if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
					t.Fatalf("content changed: %q %v", b, err)
				}
			}
		})
	}

	t.Run("Close removes the socket", func(t *testing.T) {
		path := sockPath(t)
		s := newServer()
		if err := s.Listen(path); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("socket file left after Close: %v", err)
		}
	})

	t.Run("Close spares a file put there after us", func(t *testing.T) {
		path := sockPath(t)
		s := newServer()
		if err := s.Listen(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("someone else"), 0o600); err != nil {
			t.Fatal(err)
		}
		s.Close()
		if b, err := os.ReadFile(path); err != nil || string(b) != "someone else" {
			t.Fatalf("Close removed or changed a file it does not own: %q %v", b, err)
		}
	})

	t.Run("Close spares a newer socket", func(t *testing.T) {
		path := sockPath(t)
		s := newServer()
		if err := s.Listen(path); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		other, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		s.Close()
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("Close removed another server's socket: %v", err)
		}
		c.Close()
	})
}

// 10. Rejected lines.
func TestRejectedLinesKeepConnection(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	tooLong := fmt.Sprintf("ERR command longer than %d bytes", cmdline.MaxLine)
	for _, tc := range []struct {
		name, line, want string
	}{
		{"unknown command", "__nope__", "ERR unknown command __nope__"},
		{"unknown command with args", "__nope__ a b", "ERR unknown command __nope__"},
		{"get with three args", "__get__ a b c", "ERR __get__ takes exactly 2 arguments"},
		{"put with one arg", "__put__ x", "ERR __put__ takes exactly 2 arguments"},
		{"put without args", "__put__", "ERR __put__ takes exactly 2 arguments"},
		{"info with an arg", "__info__ x", "ERR __info__ takes no arguments"},
		{"raw 0x1e", "echo a\x1e0", "ERR command contains a frame delimiter byte"},
		{"raw 0x1f", "echo a\x1fb", "ERR command contains a frame delimiter byte"},
		{"0x1e in a control line", "__put__ a\x1e b", "ERR command contains a frame delimiter byte"},
		{"NUL", "echo a\x00b", "ERR command contains a NUL byte"},
		{"over-long line", strings.Repeat("a", 70000), tooLong},
		{"one byte over MaxLine", "echo " + strings.Repeat("a", cmdline.MaxLine-4), tooLong},
		{"over-long reserved line", "__put__ " + strings.Repeat("a", 200<<10) + " b", tooLong},
		// Verbs of the protocol this build does not serve are unknown,
		// exactly like verbs no protocol defines.
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := c.roundTrip(tc.line)
			if !strings.HasPrefix(got, tc.want) || !strings.HasSuffix(got, "\n\x1e-1\n") || strings.Count(got, "\x1e") != 1 {
				t.Fatalf("got %q, want %q... with exit -1", trunc(got), tc.want)
			}
			if len(got) > 300 {
				t.Errorf("the ERR echoes %d bytes", len(got))
			}
			if got := c.roundTrip("echo ok"); got != framed("ran echo ok\n", "0") {
				t.Fatalf("next command after the rejection: %q", trunc(got))
			}
		})
	}
	// None of the rejected lines reached the guest.
	fb.mu.Lock()
	for _, e := range fb.execs {
		if e != "echo ok" {
			t.Errorf("a rejected line reached Exec: %q", trunc(e))
		}
	}
	fb.mu.Unlock()

	t.Run("exactly MaxLine is accepted", func(t *testing.T) {
		line := "echo " + strings.Repeat("a", cmdline.MaxLine-5)
		if got := c.roundTrip(line); got != framed("ran "+line+"\n", "0") {
			t.Fatalf("a MaxLine-byte command: %q", trunc(got))
		}
	})
}

// A command that fails ends its frame: with exit 255 when the guest caused
// it (nether alone may write a negative exit, and the guest's words never
// become an ERR line), with nether's own ERR text when the host did.
func TestExecErrors(t *testing.T) {
	const guestText = "ERR forged by the guest \x1e-1\n"
	reset := fmt.Errorf("%w: %s", channel.ErrReset, guestText+strings.Repeat("x", 1000))
	tests := []struct {
		name    string
		sc      script
		execErr error
		want    string
		// wantLog is in the server's log; the reply must not contain
		// the guest's text whatever happens.
		wantLog string
	}{
		{
			name:    "guest resets mid-stream",
			sc:      script{chunks: [][]byte{[]byte("partial")}, err: reset},
			want:    "partial\x1e255\n",
			wantLog: "level=WARN msg=\"control: the guest agent reset a command; its reply ends with exit 255\"",
		},
		{
			name:    "guest resets before any output",
			sc:      script{err: reset},
			want:    "\x1e255\n",
			wantLog: "guest_reason=\"stream reset: ERR forged by the guest",
		},
		{
			name:    "guest refuses at Exec",
			execErr: reset,
			want:    "\x1e255\n",
			wantLog: "level=WARN",
		},
		{
			name:    "host channel closes mid-stream",
			sc:      script{chunks: [][]byte{[]byte("partial")}, err: channel.ErrClosed},
			want:    "partial\nERR exec: channel closed\n\x1e-1\n",
			wantLog: "level=ERROR",
		},
		{
			// With no body the ERR leads the frame, so a client sees a
			// control error, not an empty line.
			name:    "host channel closes before any output",
			sc:      script{err: channel.ErrClosed},
			want:    "ERR exec: channel closed\n\x1e-1\n",
			wantLog: "level=ERROR",
		},
		{
			name:    "host failure of another kind",
			sc:      script{chunks: [][]byte{[]byte("partial\n")}, err: errors.New("host said " + guestText)},
			want:    "partial\n\nERR exec: reading the command's output failed on the host\n\x1e-1\n",
			wantLog: "level=ERROR",
		},
		{
			name:    "host failure at Exec",
			execErr: errors.New("no channel"),
			want:    "ERR exec: no channel\n\x1e-1\n",
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fb := newFake()
			fb.up()
			var logs *logBuffer
			h := start(t, fb, 0, func(s *Server) { logs = captureLog(s) })
			c := h.dial(t)
			cmd := fmt.Sprintf("cmd-%d", i)
			fb.on(cmd, tt.sc)
			fb.mu.Lock()
			fb.execErr = tt.execErr
			fb.mu.Unlock()
			got := c.roundTrip(cmd)
			if got != tt.want {
				t.Fatalf("reply %q, want %q", got, tt.want)
			}
			if strings.Contains(got, "forged") || strings.Contains(got, "xxxx") {
				t.Fatalf("the guest's text reached the client: %q", got)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Fatalf("log lacks %q:\n%s", tt.wantLog, logs.String())
			}
			if errors.Is(tt.execErr, channel.ErrReset) || errors.Is(tt.sc.err, channel.ErrReset) {
				// Logged, but bounded: the guest chooses the reason's size.
				if strings.Contains(logs.String(), strings.Repeat("x", guestReasonMax)) {
					t.Errorf("the guest's reason was logged untruncated")
				}
				if !strings.Contains(logs.String(), "...") {
					t.Errorf("the truncated reason is not marked as cut:\n%s", logs.String())
				}
			}
			// The stream is still in sync and the connection usable.
			fb.mu.Lock()
			fb.execErr = nil
			fb.mu.Unlock()
			if got := c.roundTrip("echo ok"); got != framed("ran echo ok\n", "0") {
				t.Fatalf("after the failure: %q", got)
			}
		})
	}
}

// 11. Primary disconnecting mid-command.
func TestPrimaryDisconnectMidCommand(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	gate := make(chan struct{})
	chunks := append([][]byte{[]byte("start\n")}, repeatChunks(pattern(0, 64<<10), 32)...) // 2 MiB after the gate
	fb.on("long", script{chunks: chunks, gate: gate, gateAt: 1, status: "0"})
	a := h.dial(t)
	a.send("long")
	a.readUntil("start\n", 5*time.Second)
	a.c.Close()
	// The slot is free while the command still runs in the guest.
	waitFor(t, "the primary slot to be released", 5*time.Second, h.primaryFree)
	close(gate)
	waitDrained(t, fb.output(t, "long", 0), 10*time.Second)
	b := h.dial(t)
	if got := b.roundTrip("echo b"); got != framed("ran echo b\n", "0") {
		t.Fatalf("the next primary: %q", trunc(got))
	}
	waitFor(t, "the gone client to be forgotten", 5*time.Second, func() bool { return h.clientCount() == 1 })
}

// 12. Shutdown.
func TestShutdown(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	if got := c.roundTrip("__shutdown__"); got != "OK shutting down\n\x1e0\n" {
		t.Fatalf("__shutdown__: %q", got)
	}
	// Work is serial per client: once a later command has answered,
	// Shutdown has returned.
	if got := c.roundTrip("echo after"); got != framed("ran echo after\n", "0") {
		t.Fatalf("after __shutdown__: %q", got)
	}
	if n := fb.shutdowns.Load(); n != 1 {
		t.Fatalf("Shutdown called %d times, want 1", n)
	}
}

// 13. Metering.
func TestMetering(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	a := h.dial(t)
	a.roundTrip("__help__") // admitted first: the primary
	base := h.m.Read()
	if base.Commands != 0 {
		t.Fatalf("a query counted as a command: %+v", base)
	}
	b := h.dial(t)
	b.roundTrip("echo refused") // observer: must not count

	got := a.roundTrip("echo hi")
	r := h.m.Read()
	if r.Commands != 1 {
		t.Fatalf("commands=%d after one command, want 1", r.Commands)
	}
	if in := r.BytesIn - base.BytesIn; in < uint64(len("echo hi\n")) {
		t.Errorf("bytes_in grew by %d, want >= %d", in, len("echo hi\n"))
	}
	waitFor(t, "bytes_out to count the reply", 5*time.Second, func() bool {
		return h.m.Read().BytesOut-base.BytesOut >= uint64(len(got))
	})
	stats := a.roundTrip("__stats__")
	for _, want := range []string{"\ncommands=1\n", "\nbytes_in=", "\nbytes_out="} {
		if !strings.Contains(stats, want) {
			t.Errorf("__stats__ lacks %q: %q", want, stats)
		}
	}
	if strings.Contains(stats, "\nbytes_in=0\n") || strings.Contains(stats, "\nbytes_out=0\n") {
		t.Errorf("__stats__ reports zero traffic: %q", stats)
	}
}

// Blank lines are keep-alives and get no reply; everything else is a
// command and gets exactly one framed reply. "Blank" is the parser's ASCII
// set: cmdline treats a non-ASCII space as an ordinary byte, so a line of
// one is a (shell) command and must be answered, or the client waits for
// a reply that never comes.
func TestBlankLines(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	t.Run("ASCII blanks are keep-alives", func(t *testing.T) {
		for _, keepAlive := range []string{"", " ", "\t", "\r", " \t \r"} {
			c.send(keepAlive)
		}
		if got := c.roundTrip("echo ok"); got != framed("ran echo ok\n", "0") {
			t.Fatalf("the first reply after keep-alives: %q", got)
		}
	})
	for _, tc := range []struct{ name, line string }{
		{"U+00A0 no-break space", "\u00a0"},
		{"U+0085 next line", "\u0085"},
	} {
		t.Run(tc.name+" is a command", func(t *testing.T) {
			want, err := cmdline.Parse(tc.line)
			if err != nil || want.Shell != tc.line {
				t.Fatalf("cmdline.Parse(%q) = %+v, %v; the test assumes a shell command", tc.line, want, err)
			}
			c.send(tc.line)
			body, exit, err := c.tryFrame(2 * time.Second)
			if err != nil {
				t.Fatalf("no reply to %q (a shell command per cmdline.Parse): %v", tc.line, err)
			}
			if got := framed(string(body), exit); got != framed("ran "+tc.line+"\n", "0") {
				t.Fatalf("reply to %q: %q", tc.line, got)
			}
		})
	}
}

func TestCaptureCommands(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	cases := []struct{ line, want string }{
		{"__snapshot__", "OK snapshot  kind=base pause_ms=1\n\x1e0\n"},
		{"__snapshot__ base.snap", "OK snapshot base.snap kind=base pause_ms=1\n\x1e0\n"},
		{"__snapshot__ fail", "ERR snapshot: guest not quiescent: 1 streams open\n\x1e-1\n"},
		{"__park__ fail", "ERR park: disk full\n\x1e-1\n"},
		{"__park__ p1", "OK parked p1\n\x1e0\n"},
	}
	for _, tc := range cases {
		t.Run(tc.line, func(t *testing.T) {
			if got := c.roundTrip(tc.line); got != tc.want {
				t.Fatalf("got %q want %q", got, tc.want)
			}
		})
	}
	// FinishPark runs once, for the park that succeeded, right after its
	// reply (so the client may see the reply first).
	deadline := time.Now().Add(5 * time.Second)
	for fb.parks.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond)
	if n := fb.parks.Load(); n != 1 {
		t.Fatalf("FinishPark called %d times, want 1", n)
	}
	o := h.dial(t)
	if got := o.roundTrip("__snapshot__ x"); !bytes.HasPrefix([]byte(got), []byte("ERR read-only observer")) {
		t.Fatalf("observer snapshot: %q", got)
	}
}
