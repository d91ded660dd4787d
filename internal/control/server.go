// Package control serves the control socket, protocol v2: who may connect,
// who may drive, how replies are framed and bounded, and how a client that
// stops reading is dropped without stalling the guest.
package control

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/frame"
	"github.com/nethersandbox/nether/internal/meter"
)

// ProtoVersion is the wire protocol this server speaks.
const ProtoVersion = 2

// Defaults of the timing rules in the protocol.
const (
	DefaultAgentWait     = 30 * time.Second       // a driving command waits this long for the agent
	DefaultWedgedAfter   = 5 * time.Second        // a write blocked this long drops the client
	DefaultBoundaryWait  = 250 * time.Millisecond // a query reply waits this long for a frame boundary
	DefaultMaxClients    = 16
	outputCappedMarker   = "\n...[output capped]\n"
	errAgentNotConnected = "agent not connected (guest not ready)"
	errStopping          = "nether is stopping"
	// guestReasonMax bounds how much of a guest's reset reason is logged:
	// the text is the guest's, so its size is too.
	guestReasonMax = 256
)

// Output is a running command's output as the backend hands it over.
type Output interface {
	io.Reader
	// Status is the agent's exit text, valid after Read returned io.EOF.
	Status() []byte
}

// Backend is the sandbox the server drives.
type Backend interface {
	// WaitAgent blocks until the guest agent is connected or ctx ends.
	WaitAgent(ctx context.Context) error
	// Exec starts a shell command in the guest.
	Exec(ctx context.Context, command string) (Output, error)
	// Put copies a file from the transfer jail into the guest.
	Put(ctx context.Context, hostPath, guestPath string) (int64, error)
	// Get copies a guest file into the transfer jail.
	Get(ctx context.Context, guestPath, hostPath string) (int64, error)
	// Info is the __info__ report body (key=value lines).
	Info() string
	// Shutdown begins a clean teardown; it returns at once.
	Shutdown()
	// Snapshot captures a base into the transfer jail ("" = default path)
	// and returns the OK line.
	Snapshot(ctx context.Context, path string) (string, error)
	// Park captures a one-shot park and returns the OK line; after the
	// reply is written the server calls FinishPark, which ends the process.
	Park(ctx context.Context, path string) (string, error)
	FinishPark()
}

// Server is the control socket server.
type Server struct {
	log     *slog.Logger
	backend Backend
	meter   *meter.Meter
	maxOut  int64 // 0 = unlimited

	AgentWait    time.Duration
	WedgedAfter  time.Duration
	BoundaryWait time.Duration
	MaxClients   int

	// cmds is what this build serves: the parser and __help__ read it.
	cmds *cmdline.Set
	// ctx is the session's root context, set by Serve before the first
	// client is admitted. Every Backend call and every client context
	// derives from it.
	ctx context.Context

	ln       *net.UnixListener
	path     string
	sockIno  uint64
	mu       sync.Mutex
	clients  map[*client]struct{}
	primary  *client
	closed   bool
	uid      int
	accepted chan struct{}
}

// New makes a server; Listen binds it.
func New(log *slog.Logger, b Backend, m *meter.Meter, maxOutput int64) *Server {
	cmds, err := servedSet()
	if err != nil {
		// A handler for a verb the table lacks is a programming error
		// that TestHandlersMatchTable catches before any build ships.
		panic(err)
	}
	return &Server{
		log: log, backend: b, meter: m, maxOut: maxOutput,
		AgentWait: DefaultAgentWait, WedgedAfter: DefaultWedgedAfter,
		BoundaryWait: DefaultBoundaryWait, MaxClients: DefaultMaxClients,
		cmds: cmds, ctx: context.Background(),
		clients: map[*client]struct{}{}, uid: os.Getuid(),
	}
}

// Listen binds the socket at path. A socket file left by a nether that
// died is replaced; one that a live process still serves is refused, so
// two sandboxes never fight over one path.
func (s *Server) Listen(path string) error {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("control_socket %s exists and is not a socket; refusing to replace it", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("control_socket %s is served by a running process; refusing to take it over", path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("checking existing control_socket %s: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("removing stale control_socket %s: %w", path, err)
		}
		s.log.Info("replaced a stale control socket", "path", path)
	}
	// Bind with a restrictive umask so the socket is never, even for a
	// moment, connectable by another user.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return fmt.Errorf("listening on control_socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("chmod control_socket: %w", err)
	}
	ln.SetUnlinkOnClose(false) // we unlink it ourselves, only if it is still ours
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		s.sockIno = st.Ino
	}
	s.ln, s.path = ln, path
	return nil
}

// Serve accepts clients until ctx is cancelled or Close is called. ctx is
// the session's root context: the contexts of clients and of every
// Backend call derive from it, so cancelling it also ends a client's wait
// for the agent and tells the backend to give up on work in flight.
// Cancelling ctx stops accepting; Close still drops the clients and
// removes the socket file.
func (s *Server) Serve(ctx context.Context) {
	s.ctx = ctx
	// Accept has no context; closing the listener is what unblocks it.
	// Accept returns as soon as the close begins, before the socket is
	// shut, so Serve waits for the close to finish: once it returns, a
	// client that dials is refused, not queued on a dying backlog.
	lnClosed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		s.ln.Close()
		close(lnClosed)
	})
	defer func() {
		if !stop() {
			<-lnClosed
		}
	}()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				s.log.Info("control: stopped accepting clients", "why", context.Cause(ctx))
				return
			}
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.log.Error("control: accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.admit(conn)
	}
}

// Close stops accepting, drops every client and removes the socket file.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	cs := make([]*client, 0, len(s.clients))
	for c := range s.clients {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	if s.ln != nil {
		s.ln.Close()
		var st unix.Stat_t
		if err := unix.Stat(s.path, &st); err == nil && st.Ino == s.sockIno {
			os.Remove(s.path)
		}
	}
	// Workers still relaying a command end when the channel closes; we
	// do not wait for them here, because the guest may still be running.
	for _, c := range cs {
		c.drop("server closing")
	}
}

func (s *Server) admit(conn *net.UnixConn) {
	uid, err := peerUID(conn)
	if err != nil || uid != s.uid {
		s.log.Warn("control: refused a client of another user", "peer_uid", uid, "err", err)
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write(frame.Framed("ERR permission denied: the control socket is owner-only", -1))
		conn.Close()
		return
	}
	s.mu.Lock()
	if s.closed || s.ctx.Err() != nil {
		s.mu.Unlock()
		conn.Close()
		return
	}
	if len(s.clients) >= s.MaxClients {
		s.mu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write(frame.Framed(fmt.Sprintf("ERR too many clients (limit %d)", s.MaxClients), -1))
		conn.Close()
		return
	}
	c := newClient(s, conn)
	s.clients[c] = struct{}{}
	if s.primary != nil && peerHungUp(s.primary.conn) {
		// The seat rule: the primary holds the slot until its peer hangs
		// up, not until we have read what it sent. A client that connects
		// after the primary closed is the next primary, as a client that
		// reconnects right after quitting expects, whether or not the old
		// one's reader has reached its end-of-file yet. What the old
		// primary sent before it hung up is still read and run with the
		// rights it was sent with; its reader drops it at end-of-file.
		s.log.Info("control: the primary hung up; its slot passes to the new client")
		s.primary = nil
	}
	if s.primary == nil {
		s.primary = c
		c.primary = true
	}
	s.mu.Unlock()
	s.log.Info("control: client connected", "primary", c.primary)
	go c.readLoop()
	go c.workLoop()
}

func (s *Server) release(c *client) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.clients, c)
	if s.primary == c {
		s.primary = nil
	}
}

// client is one connection.
type client struct {
	s       *Server
	conn    *net.UnixConn
	primary bool // set once at admission

	wmu    sync.Mutex    // serialises every write to conn
	frame  chan struct{} // held from a relayed reply's first byte to its trailer
	work   chan job
	done   chan struct{}
	once   sync.Once
	ctx    context.Context
	cancel context.CancelFunc
}

func newClient(s *Server, conn *net.UnixConn) *client {
	// The client's context ends when it leaves or when the session ends.
	ctx, cancel := context.WithCancel(s.ctx)
	return &client{
		s: s, conn: conn, frame: make(chan struct{}, 1),
		work: make(chan job, 64), done: make(chan struct{}),
		ctx: ctx, cancel: cancel,
	}
}

// drop disconnects the client and frees its slot. Work it queued that has
// reached the guest runs on; its output is drained and discarded.
func (c *client) drop(why string) {
	c.once.Do(func() {
		c.s.log.Info("control: client dropped", "primary", c.primary, "why", why)
		// Free the slot before the client can see its connection close,
		// so a client that reconnects at once finds it free.
		c.s.release(c)
		c.cancel()
		close(c.done)
		c.conn.Close()
	})
}

// write sends b, giving up (and dropping the client) when the client has
// not taken the bytes within WedgedAfter: a client that stops reading must
// never back up the relay into the guest.
func (c *client) write(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.done:
		return net.ErrClosed
	default:
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.s.WedgedAfter))
	n, err := c.conn.Write(b)
	c.s.meter.Out(n)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			go c.drop(fmt.Sprintf("wedged: a write blocked for more than %s", c.s.WedgedAfter))
		} else {
			go c.drop("write failed: " + err.Error())
		}
		return err
	}
	return nil
}

// reply writes a complete host-generated frame, waiting briefly for the
// end of a relayed frame in progress so the two never interleave.
func (c *client) reply(body string, exit int) {
	t := time.NewTimer(c.s.BoundaryWait)
	defer t.Stop()
	select {
	case c.frame <- struct{}{}:
		defer func() { <-c.frame }()
	case <-t.C:
		// Stay serial is the contract; after the bounded wait we write
		// anyway rather than hold the reply hostage to a long stream.
	case <-c.done:
		return
	}
	c.write(frame.Framed(body, exit))
}

func (c *client) errReply(format string, a ...any) {
	c.reply("ERR "+fmt.Sprintf(format, a...), -1)
}

func (c *client) readLoop() {
	defer close(c.work)
	r := bufio.NewReaderSize(c.conn, 64<<10)
	for {
		line, n, err := readLine(r, cmdline.MaxLine)
		c.s.meter.In(n)
		if errors.Is(err, errLineTooLong) {
			c.errReply("command longer than %d bytes", cmdline.MaxLine)
			continue
		}
		if err != nil {
			c.drop("disconnected")
			return
		}
		cmd, perr := c.s.cmds.Parse(line)
		if errors.Is(perr, cmdline.ErrEmpty) {
			continue // blank lines are keep-alives, not commands
		}
		if perr != nil {
			c.errReply("%v", perr)
			continue
		}
		c.dispatch(cmd)
	}
}

func (c *client) workLoop() {
	for j := range c.work {
		if c.ctx.Err() != nil {
			// The client left, or the session is ending: what was queued
			// behind the running command must not drive the guest on
			// behalf of nobody. A client still connected is told why
			// (a client that left gets nothing: its connection is closed).
			c.errReply(errStopping)
			continue
		}
		j.h.run(c, j.cmd)
	}
}

// backendCtx is the context of one Backend call: the session's root, not
// the client's, because work that reached the guest runs to completion
// (and its output is drained) even if the client goes away.
func (c *client) backendCtx() (context.Context, context.CancelFunc) {
	return context.WithCancel(c.s.ctx)
}

// capture runs __snapshot__ or __park__. The reply comes only when the
// artifact is committed on disk.
func (c *client) capture(cmd cmdline.Command) {
	if !c.waitAgent() {
		return
	}
	path := ""
	if len(cmd.Args) > 0 {
		path = cmd.Args[0]
	}
	name := verb(cmd)
	ctx, cancel := c.backendCtx()
	defer cancel()
	if cmd.Name == "__park__" {
		body, err := c.s.backend.Park(ctx, path)
		if err != nil {
			c.errReply("%s: %v", name, err)
			return
		}
		c.reply(body, 0)
		c.s.backend.FinishPark()
		return
	}
	body, err := c.s.backend.Snapshot(ctx, path)
	if err != nil {
		c.errReply("%s: %v", name, err)
		return
	}
	c.reply(body, 0)
}

// waitAgent applies the readiness rule: a driving command waits, bounded,
// for the agent.
func (c *client) waitAgent() bool {
	ctx, cancel := context.WithTimeout(c.ctx, c.s.AgentWait)
	defer cancel()
	if err := c.s.backend.WaitAgent(ctx); err != nil {
		if c.s.ctx.Err() != nil {
			c.errReply(errStopping)
		} else {
			c.errReply(errAgentNotConnected)
		}
		return false
	}
	return true
}

func (c *client) transfer(cmd cmdline.Command, op func(context.Context, string, string) (int64, error)) {
	if !c.waitAgent() {
		return
	}
	// The transfer runs to completion even if this client goes away: a
	// half-done transfer is cleaned up by the side that receives it.
	ctx, cancel := c.backendCtx()
	defer cancel()
	n, err := op(ctx, cmd.Args[0], cmd.Args[1])
	if err != nil {
		c.errReply("%s: %v", verb(cmd), err)
		return
	}
	c.s.meter.Command()
	c.reply(fmt.Sprintf("OK %s %d bytes", verb(cmd), n), 0)
}

// runShell relays a command: output escaped and bounded as it streams,
// then the trailer with the exit clamped to 0..255. The guest's output is
// always drained to the end, client or no client.
//
// Only nether may produce a negative exit. A failure the guest caused (its
// agent reset the stream) therefore ends the frame with exit 255, like a
// malformed trailer, and the guest's reason goes to the log, never into an
// ERR line. A failure on the host ends it with nether's own ERR text.
func (c *client) runShell(command string) {
	if !c.waitAgent() {
		return
	}
	ctx, cancel := c.backendCtx()
	defer cancel()
	out, err := c.s.backend.Exec(ctx, command)
	if err != nil && !errors.Is(err, channel.ErrReset) {
		c.errReply("exec: %v", err)
		return
	}
	c.s.meter.Command()
	select {
	case c.frame <- struct{}{}:
		defer func() { <-c.frame }()
	case <-c.done:
	}
	if err != nil {
		// The agent refused the command outright: an empty body, exit 255.
		c.guestReset(err)
		c.write(frame.Trailer(255))
		return
	}
	var (
		sent    int64
		capped  bool
		gone    bool
		buf     = make([]byte, 32<<10)
		escaped []byte
	)
	for {
		n, rerr := out.Read(buf)
		if n > 0 && !gone && !capped {
			chunk := buf[:n]
			escaped = escaped[:0]
			if room := c.s.maxOut - sent; c.s.maxOut > 0 && int64(n) > room {
				chunk, capped = chunk[:room], true
			}
			sent += int64(len(chunk))
			escaped = frame.AppendEscaped(escaped, chunk)
			if capped {
				escaped = append(escaped, outputCappedMarker...)
			}
			if c.write(escaped) != nil {
				gone = true
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			// The frame must still end, or the client waits forever and
			// reads whatever follows as this reply.
			if errors.Is(rerr, channel.ErrReset) {
				c.guestReset(rerr)
				if !gone {
					c.write(frame.Trailer(255))
				}
				return
			}
			reason := hostExecFailure(rerr)
			c.s.log.Error("control: relaying a command's output failed", "err", rerr, "reply", reason)
			if !gone {
				c.write(append([]byte("\n"), frame.Framed("ERR "+reason, -1)...))
			}
			return
		}
	}
	if !gone {
		c.write(frame.Trailer(frame.ClampExit(out.Status())))
	}
}

// guestReset logs why the guest agent reset a command's stream. The reason
// is guest text: it is logged, truncated, and never sent to the client.
func (c *client) guestReset(err error) {
	reason := err.Error()
	if len(reason) > guestReasonMax {
		// A rune split by the cut becomes U+FFFD rather than a stray byte.
		reason = strings.ToValidUTF8(reason[:guestReasonMax], "\uFFFD") + "..."
	}
	c.s.log.Warn("control: the guest agent reset a command; its reply ends with exit 255", "guest_reason", reason)
}

// hostExecFailure is the ERR text for a running command whose output
// failed on the host. It is chosen by class from nether's own words and
// never copied from err, so no byte the guest sent can appear in it.
func hostExecFailure(err error) string {
	switch {
	case errors.Is(err, channel.ErrClosed):
		return "exec: channel closed"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "exec: cancelled: " + errStopping
	}
	return "exec: reading the command's output failed on the host"
}

var errLineTooLong = errors.New("line too long")

// readLine reads one \n-terminated line of at most max bytes and reports
// how many bytes it consumed. A longer line is consumed to its end and
// reported as errLineTooLong, so the next line is read in sync.
func readLine(r *bufio.Reader, max int) (string, int, error) {
	var b []byte
	n := 0
	tooLong := false
	for {
		part, err := r.ReadSlice('\n')
		n += len(part)
		if !tooLong {
			b = append(b, part...)
			if len(b) > max+1 {
				tooLong, b = true, nil
			}
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return string(b), n, err
		}
		if tooLong {
			return "", n, errLineTooLong
		}
		return strings.TrimRight(string(b), "\r\n"), n, nil
	}
}
