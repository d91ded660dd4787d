package control

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/controltest"
	"github.com/nethersandbox/nether/internal/framebuf"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/screen"
)

// script is what the fake guest does for one shell command.
type script struct {
	chunks [][]byte      // output, handed over one chunk per Read
	delay  time.Duration // before every chunk
	gateAt int           // with gate != nil: block before chunk gateAt until gate closes
	gate   chan struct{}
	// deaf makes the gated Read ignore its context: a guest that never
	// answers, however the host gives up on it.
	deaf   bool
	status string // the agent's exit text, reported after EOF
	err    error  // returned by Read after the chunks instead of io.EOF
}

// fakeOutput is one running command's output.
type fakeOutput struct {
	ctx     context.Context // Exec's: a gated Read gives up when it ends
	sc      script
	i       int           // next chunk
	rest    []byte        // unread part of the current chunk
	served  atomic.Int32  // chunks handed over so far
	drained chan struct{} // closed when Read has returned io.EOF or sc.err
	once    sync.Once
}

func (o *fakeOutput) Read(p []byte) (int, error) {
	if len(o.rest) == 0 {
		if o.i >= len(o.sc.chunks) {
			o.once.Do(func() { close(o.drained) })
			if o.sc.err != nil {
				return 0, o.sc.err
			}
			return 0, io.EOF
		}
		if o.sc.gate != nil && o.i == o.sc.gateAt && o.sc.deaf {
			<-o.sc.gate
		} else if o.sc.gate != nil && o.i == o.sc.gateAt {
			select {
			case <-o.sc.gate:
			case <-o.ctx.Done():
				// What a real stream does when its context ends.
				o.once.Do(func() { close(o.drained) })
				return 0, o.ctx.Err()
			}
		}
		if o.sc.delay > 0 {
			time.Sleep(o.sc.delay)
		}
		o.rest = o.sc.chunks[o.i]
		o.i++
		o.served.Add(1)
	}
	n := copy(p, o.rest)
	o.rest = o.rest[n:]
	return n, nil
}

func (o *fakeOutput) Status() []byte { return []byte(o.sc.status) }

// fakeBackend is a scripted Backend. Shell commands look their script up
// by the exact command text; an unknown command echoes "ran <cmd>\n" and
// exits 0.
type fakeBackend struct {
	agentUp   chan struct{}
	agentOnce sync.Once

	mu      sync.Mutex
	scripts map[string]script
	execs   []string
	outs    map[string][]*fakeOutput
	execErr error // returned by Exec when set

	waitCalls  atomic.Int32
	shutdowns  atomic.Int32
	parks      atomic.Int32
	captures   []string
	putCalls   atomic.Int32
	getCalls   atomic.Int32
	execSignal chan string // optional: receives every command Exec starts

	// ctxs records the context of every call that takes one, by method.
	ctxs map[string][]context.Context
	// block, when set, makes Put, Get, Snapshot and Park wait for their
	// context to end, and return its error.
	block bool
	// deaf, when set, makes those blocked calls, and WaitAgent without
	// an agent, ignore their context: they wait for deaf to close.
	deaf chan struct{}

	// term is the console's terminal; display, when set, the frame the
	// fake display shows (nil: no display).
	term    *screen.Terminal
	display *framebuf.Image
}

func newFake() *fakeBackend {
	return &fakeBackend{
		term:    screen.New(20, 4, 10),
		agentUp: make(chan struct{}),
		scripts: map[string]script{},
		outs:    map[string][]*fakeOutput{},
		ctxs:    map[string][]context.Context{},
	}
}

// record notes ctx as a context method was called with, and reports
// whether the call should block until it ends.
func (f *fakeBackend) record(method string, ctx context.Context) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ctxs[method] = append(f.ctxs[method], ctx)
	return f.block
}

// wait blocks a call until ctx ends, or, when the backend is deaf, until
// deaf closes; it returns what the call returns.
func (f *fakeBackend) wait(ctx context.Context) error {
	f.mu.Lock()
	deaf := f.deaf
	f.mu.Unlock()
	if deaf != nil {
		<-deaf
		return errors.New("released")
	}
	<-ctx.Done()
	return ctx.Err()
}

// contexts returns the contexts method was called with.
func (f *fakeBackend) contexts(method string) []context.Context {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]context.Context(nil), f.ctxs[method]...)
}

// up connects the fake agent.
func (f *fakeBackend) up() { f.agentOnce.Do(func() { close(f.agentUp) }) }

func (f *fakeBackend) on(cmd string, sc script) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scripts[cmd] = sc
}

func (f *fakeBackend) WaitAgent(ctx context.Context) error {
	f.record("WaitAgent", ctx)
	f.waitCalls.Add(1)
	select {
	case <-f.agentUp: // a connected agent wins over a finished ctx
		return nil
	default:
	}
	f.mu.Lock()
	deaf := f.deaf
	f.mu.Unlock()
	if deaf != nil {
		select {
		case <-f.agentUp:
			return nil
		case <-deaf:
			return errors.New("released")
		}
	}
	select {
	case <-f.agentUp:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeBackend) Exec(ctx context.Context, command string) (Output, error) {
	f.record("Exec", ctx)
	f.mu.Lock()
	if f.execErr != nil {
		f.mu.Unlock()
		return nil, f.execErr
	}
	sc, ok := f.scripts[command]
	if !ok {
		sc = script{chunks: [][]byte{[]byte("ran " + command + "\n")}, status: "0"}
	}
	o := &fakeOutput{ctx: ctx, sc: sc, drained: make(chan struct{})}
	f.execs = append(f.execs, command)
	f.outs[command] = append(f.outs[command], o)
	sig := f.execSignal
	f.mu.Unlock()
	if sig != nil {
		sig <- command
	}
	return o, nil
}

func (f *fakeBackend) Put(ctx context.Context, hostPath, guestPath string) (int64, error) {
	f.putCalls.Add(1)
	if f.record("Put", ctx) {
		return 0, f.wait(ctx)
	}
	return 42, nil
}

func (f *fakeBackend) Get(ctx context.Context, guestPath, hostPath string) (int64, error) {
	f.getCalls.Add(1)
	if f.record("Get", ctx) {
		return 0, f.wait(ctx)
	}
	return 7, nil
}

func (f *fakeBackend) Info() string {
	return "proto_version=2\nbackend=fake\nmax_output_bytes=1048576\n"
}

func (f *fakeBackend) Shutdown() { f.shutdowns.Add(1) }

// Snapshot and Park succeed unless the path is "fail"; they record the
// paths they were given.
func (f *fakeBackend) Snapshot(ctx context.Context, path string) (string, error) {
	if f.record("Snapshot", ctx) {
		return "", f.wait(ctx)
	}
	f.mu.Lock()
	f.captures = append(f.captures, "snapshot "+path)
	f.mu.Unlock()
	if path == "fail" {
		return "", errors.New("guest not quiescent: 1 streams open")
	}
	return "OK snapshot " + path + " kind=base pause_ms=1", nil
}

func (f *fakeBackend) Park(ctx context.Context, path string) (string, error) {
	if f.record("Park", ctx) {
		return "", f.wait(ctx)
	}
	f.mu.Lock()
	f.captures = append(f.captures, "park "+path)
	f.mu.Unlock()
	if path == "fail" {
		return "", errors.New("disk full")
	}
	return "OK parked " + path, nil
}

func (f *fakeBackend) FinishPark() { f.parks.Add(1) }

// Claim succeeds unless the sandbox id is "fail"; it records what it was
// given. It never waits for the agent: the session decides whether a
// sandbox is ready to be claimed.
func (f *fakeBackend) Claim(ctx context.Context, c ClaimRequest) (string, error) {
	sandboxID, hostname := c.SandboxID, c.Hostname
	if f.record("Claim", ctx) {
		return "", f.wait(ctx)
	}
	f.mu.Lock()
	f.captures = append(f.captures, strings.TrimSpace("claim "+sandboxID+" "+hostname+" "+c.BootID))
	f.mu.Unlock()
	if sandboxID == "fail" {
		return "", errors.New("only a fork of a base can be claimed;\nthis sandbox booted")
	}
	return "OK claimed " + sandboxID + " " + hostname, nil
}

func (f *fakeBackend) Screen() ([]byte, error) { return f.term.Screen(), nil }

func (f *fakeBackend) ScreenDiff(v *screen.View) ([]byte, error) { return f.term.Diff(v), nil }

var errNoGPU = errors.New("needs gpu = 1 in nether.conf")

func (f *fakeBackend) Frame(ctx context.Context) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.display == nil {
		return nil, errNoGPU
	}
	return f.display.PPM(), nil
}

func (f *fakeBackend) FrameDiff(ctx context.Context, v *framebuf.View) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.display == nil {
		return nil, errNoGPU
	}
	return v.Diff(*f.display, framebuf.DefaultTile), nil
}

func (f *fakeBackend) execCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.execs)
}

// output returns the n-th fakeOutput started for cmd, waiting for it.
func (f *fakeBackend) output(t *testing.T, cmd string, n int) *fakeOutput {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		outs := f.outs[cmd]
		f.mu.Unlock()
		if len(outs) > n {
			return outs[n]
		}
		if time.Now().After(deadline) {
			t.Fatalf("Exec(%q) #%d never started", cmd, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDrained waits until the server has read o to its end.
func waitDrained(t *testing.T, o *fakeOutput, within time.Duration) {
	t.Helper()
	select {
	case <-o.drained:
	case <-time.After(within):
		t.Fatalf("the server did not drain the command output to EOF within %s (read %d of %d chunks)", within, o.served.Load(), len(o.sc.chunks))
	}
}

// ---- server harness ----

type harness struct {
	s    *Server
	fb   *fakeBackend
	m    *meter.Meter
	path string
	// ctx is the root context Serve runs under; cancel ends the session.
	ctx    context.Context
	cancel context.CancelFunc
	// served is closed when Serve has returned.
	served chan struct{}
}

// sockPath is a socket path short enough for sun_path.
func sockPath(t *testing.T) string { return controltest.SocketPath(t) }

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// logBuffer collects a server's log for a test to inspect.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// captureLog points s's log at a buffer, at every level.
func captureLog(s *Server) *logBuffer {
	b := &logBuffer{}
	s.log = slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return b
}

// rootKey marks the root context a harness passes to Serve.
type rootKey struct{}

// start runs a server on a fresh socket; tune adjusts it before Serve.
func start(t *testing.T, fb *fakeBackend, maxOut int64, tune func(*Server)) *harness {
	t.Helper()
	return startOn(t, sockPath(t), fb, maxOut, tune)
}

// startOn is start on a given socket path.
func startOn(t *testing.T, path string, fb *fakeBackend, maxOut int64, tune func(*Server)) *harness {
	t.Helper()
	m := meter.New(nil, 512, 2)
	s := New(quietLog(), fb, m, maxOut)
	if tune != nil {
		tune(s)
	}
	if err := s.Listen(path); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	// The root context carries a value unique to this server, so a test
	// can tell whether a context derives from it.
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), rootKey{}, new(int)))
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		s.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
		cancel()
	})
	return &harness{s: s, fb: fb, m: m, path: path, ctx: ctx, cancel: cancel, served: done}
}

// conn is a raw client connection with a buffered reader.
type conn struct {
	t  *testing.T
	c  *net.UnixConn
	br *bufio.Reader
}

func (h *harness) dial(t *testing.T) *conn {
	t.Helper()
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: h.path, Net: "unix"})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{t: t, c: c, br: bufio.NewReaderSize(c, 64<<10)}
}

func (c *conn) send(line string) {
	c.t.Helper()
	c.c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.c.Write([]byte(line + "\n")); err != nil {
		c.t.Fatalf("send %q: %v", trunc(line), err)
	}
}

// readFrame reads raw wire bytes up to and including a trailer: the body
// as sent (still escaped), then the exit text. It fails the test on a
// timeout or a stream error.
func (c *conn) readFrame(within time.Duration) (body []byte, exit string) {
	c.t.Helper()
	body, exit, err := c.tryFrame(within)
	if err != nil {
		c.t.Fatalf("reading a frame: %v (body so far %q)", err, trunc(string(body)))
	}
	return body, exit
}

func (c *conn) tryFrame(within time.Duration) (body []byte, exit string, err error) {
	c.c.SetReadDeadline(time.Now().Add(within))
	defer c.c.SetReadDeadline(time.Time{})
	body, err = c.br.ReadBytes(0x1e)
	if err != nil {
		return body, "", err
	}
	body = body[:len(body)-1]
	text, err := c.br.ReadString('\n')
	if err != nil {
		return body, text, err
	}
	return body, text[:len(text)-1], nil
}

// roundTrip sends line and returns its whole reply as raw wire bytes.
func (c *conn) roundTrip(line string) string {
	c.t.Helper()
	c.send(line)
	body, exit := c.readFrame(10 * time.Second)
	return string(body) + "\x1e" + exit + "\n"
}

// readUntilClosed reads everything left and reports whether the stream
// ended (EOF or reset) rather than timing out.
func (c *conn) readUntilClosed(within time.Duration) ([]byte, bool) {
	c.c.SetReadDeadline(time.Now().Add(within))
	defer c.c.SetReadDeadline(time.Time{})
	var buf bytes.Buffer
	_, err := io.Copy(&buf, c.br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return buf.Bytes(), false
	}
	return buf.Bytes(), true
}

// primaryFree reports whether the server has no primary client.
func (h *harness) primaryFree() bool {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return h.s.primary == nil
}

func (h *harness) clientCount() int {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	return len(h.s.clients)
}

// waitFor polls cond (server-internal state) until it holds.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func trunc(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

// framed is the expected wire form of a reply.
func framed(body, exit string) string { return body + "\x1e" + exit + "\n" }
