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
	"sync/atomic"
	"time"

	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/frame"
	"github.com/nethersandbox/nether/internal/framebuf"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/screen"
	"github.com/nethersandbox/nether/internal/unixsock"
)

// ProtoVersion is the wire protocol this server speaks.
const ProtoVersion = 2

// Defaults of the timing rules in the protocol.
const (
	DefaultAgentWait     = 30 * time.Second       // a driving command waits this long for the agent
	DefaultWedgedAfter   = 5 * time.Second        // a write blocked this long drops the client
	DefaultBoundaryWait  = 250 * time.Millisecond // a query reply waits this long for a frame boundary
	DefaultMaxClients    = 16
	DefaultStopWait      = time.Second // Stop waits this long for replies to end
	outputCappedMarker   = "\n...[output capped]\n"
	errAgentNotConnected = "agent not connected (guest not ready)"
	errStopping          = "nether is stopping"
	// guestReasonMax bounds how much of a guest's reset reason is logged:
	// the text is the guest's, so its size is too.
	guestReasonMax = 256
	// stopReasonMax bounds the reason Stop puts in its ERR line.
	stopReasonMax = 256
	// closeReason is the stop reason of Close, for callers that do not
	// know why the server closes.
	closeReason = "nether is stopping"
)

// errReplyEnded is what writing to a reply that has already ended returns.
var errReplyEnded = errors.New("the reply has already ended")

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
	// Claim gives a restored fork the identity a warm pool hands it
	// (sandbox id, hostname, and optionally the boot identity; the
	// backend adds what goes with them) and returns the OK line; it
	// refuses, saying why, anything else.
	Claim(ctx context.Context, c ClaimRequest) (string, error)
	// Screen renders the console's terminal (__screen__), and ScreenDiff
	// the rows changed since v was last used (__screendiff__).
	Screen() ([]byte, error)
	ScreenDiff(v *screen.View) ([]byte, error)
	// Frame is the display's scanout as a PPM (__frame__), and FrameDiff
	// the tiles changed since v was last used (__framediff__); both fail
	// with a reason a user can act on when there is no display.
	Frame(ctx context.Context) ([]byte, error)
	FrameDiff(ctx context.Context, v *framebuf.View) ([]byte, error)
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
	// StopWait bounds how long Stop waits for the replies it ended to
	// reach their clients before it closes every connection.
	StopWait time.Duration
	// Observe is where commands are recorded; set before Serve.
	Observe Observe
	seq     cmdSeq

	// cmds is what this build serves: the parser and __help__ read it.
	cmds *cmdline.Set
	// ctx is the session's root context, set by Serve before the first
	// client is admitted. Every Backend call and every client context
	// derives from it.
	ctx context.Context
	// stopCtx ends when Stop begins; its cause carries the ERR line every
	// reply still owed gets (see stopText). Work that Stop cancels runs
	// under a context joined to it (see stoppable).
	stopCtx    context.Context
	stopCancel context.CancelCauseFunc
	stopped    chan struct{} // closed when Stop has finished

	ln       *unixsock.Listener
	mu       sync.Mutex
	clients  map[*client]struct{}
	primary  *client
	closed   bool
	uid      int
	accepted chan struct{}

	// Activity, for the idle budget: handlers running, and when the
	// server last had a client or a command (unix nanoseconds).
	busy       atomic.Int64
	lastActive atomic.Int64
}

// New makes a server; Listen binds it.
func New(log *slog.Logger, b Backend, m *meter.Meter, maxOutput int64) *Server {
	cmds, err := servedSet()
	if err != nil {
		// A handler for a verb the table lacks is a programming error
		// that TestHandlersMatchTable catches before any build ships.
		panic(err)
	}
	stopCtx, stopCancel := context.WithCancelCause(context.Background())
	srv := &Server{
		log: log, backend: b, meter: m, maxOut: maxOutput,
		AgentWait: DefaultAgentWait, WedgedAfter: DefaultWedgedAfter,
		BoundaryWait: DefaultBoundaryWait, MaxClients: DefaultMaxClients,
		StopWait: DefaultStopWait,
		cmds:     cmds, ctx: context.Background(),
		stopCtx: stopCtx, stopCancel: stopCancel, stopped: make(chan struct{}),
		clients: map[*client]struct{}{}, uid: os.Getuid(),
	}
	srv.touch()
	return srv
}

// touch records activity now.
func (s *Server) touch() { s.lastActive.Store(time.Now().UnixNano()) }

// Touch records activity that reaches the sandbox other than through a
// client (data-plane traffic), so IdleFor counts from it too.
func (s *Server) Touch() { s.touch() }

// IdleFor reports how long the server has had no client connected and no
// command or transfer running (0 while it has either): what the idle
// budget measures. A command keeps running after its client leaves, so it
// holds the sandbox awake until it ends.
func (s *Server) IdleFor(now time.Time) time.Duration {
	s.mu.Lock()
	n := len(s.clients)
	s.mu.Unlock()
	if n > 0 || s.busy.Load() > 0 {
		return 0
	}
	return max(0, now.Sub(time.Unix(0, s.lastActive.Load())))
}

// stopError is the cause of stopCtx: the ERR line of a stopping server.
type stopError struct{ text string }

func (e *stopError) Error() string { return e.text }

// stopText returns the ERR line every reply still owed gets once Stop has
// begun, and whether it has.
func (s *Server) stopText() (string, bool) {
	if s.stopCtx.Err() == nil {
		return "", false
	}
	var se *stopError
	if errors.As(context.Cause(s.stopCtx), &se) {
		return se.text, true
	}
	return "ERR sandbox stopping", true
}

// stoppable derives a context from parent that also ends, with Stop's
// cause, when the server stops.
func (s *Server) stoppable(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(parent)
	unhook := context.AfterFunc(s.stopCtx, func() { cancel(context.Cause(s.stopCtx)) })
	return ctx, func() {
		unhook()
		cancel(context.Canceled)
	}
}

// channelGoneWait bounds how long a reply whose channel closed waits for
// the session's Stop, so that it can name why the sandbox ended.
const channelGoneWait = time.Second

// awaitStop: a channel that closed under a command means the sandbox is
// ending (its engine died); the session calls Stop with the reason a
// moment later. Waiting for it, bounded, lets the reply say
// "sandbox stopping: <reason>" rather than only "channel closed".
func (s *Server) awaitStop(err error) {
	if !errors.Is(err, channel.ErrClosed) {
		return
	}
	t := time.NewTimer(channelGoneWait)
	defer t.Stop()
	select {
	case <-s.stopCtx.Done():
	case <-t.C:
	}
}

// stopLine is the ERR line of Stop(reason). The reason comes from the
// session and may quote anything (an error from a restore, say), so it is
// kept to one bounded line of printable text.
func stopLine(reason string) string {
	reason = oneLine(reason)
	if reason == "" {
		reason = "no reason given"
	}
	return "ERR sandbox stopping: " + reason
}

// oneLine keeps text that goes into an ERR line to one bounded line of
// printable UTF-8, so it can never forge or break a frame.
func oneLine(text string) string {
	text = strings.ToValidUTF8(text, "\uFFFD")
	text = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, text)
	text = strings.TrimSpace(text)
	if len(text) > stopReasonMax {
		text = strings.ToValidUTF8(text[:stopReasonMax], "") + "..."
	}
	return text
}

// Listen binds the control socket at path (owner-only; a stale socket
// file is replaced, a live one refused: unixsock.Listen).
func (s *Server) Listen(path string) error {
	ln, err := unixsock.Listen(path, "control_socket")
	if err != nil {
		return err
	}
	s.ln = ln
	return nil
}

// Serve accepts clients until ctx is cancelled or Stop (or Close) is
// called. ctx is the session's root context: the contexts of clients and
// of every Backend call derive from it, so cancelling it also ends a
// client's wait for the agent and tells the backend to give up on work in
// flight. Cancelling ctx stops accepting; Stop still ends the replies owed,
// drops the clients and removes the socket file.
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

// Close is Stop for a caller that does not know why the server closes.
func (s *Server) Close() { s.Stop(closeReason) }

// Stop ends the control server because the sandbox is ending, for reason
// (a signal, a failed restore, ...). Every command still owed a reply gets
// a framed control error, "ERR sandbox stopping: <reason>" with exit -1,
// before its client is closed:
//
//   - a command running now, including one waiting for the agent: its
//     work is cancelled (the contexts of WaitAgent, Exec, Put and Get
//     end, with a cause that carries the ERR line) and its reply ends at
//     once, without waiting for the backend to return. A shell command
//     that streamed part of its output gets "\n" and then the ERR, so the
//     frame still ends. A capture (__snapshot__, __park__) is answered
//     the same way, but its context is not cancelled: whether a capture
//     in progress commits is the session's decision (it cancels the root
//     context when it will not wait);
//   - every command queued behind it, that is every line the client sent
//     before Stop began, whether or not the server had read it yet: the
//     same ERR, in order. (Queries among those lines are answered as
//     usual.) Stop shuts each client's read side, so a client that writes
//     after that gets EPIPE rather than silence.
//
// Stop stops accepting first, then waits for those replies to be written,
// at most StopWait (a client that does not read is not waited for past
// that), closes every client and removes the socket file. A reply that
// ended before Stop began (a shell command's own trailer, say) is not
// touched; an idle client just sees its connection close.
//
// Stop may be called before Serve, during it, or after the root context
// ended, and more than once: a later call waits for the first to finish
// and ignores its reason.
func (s *Server) Stop(reason string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.stopped
		return
	}
	s.closed = true
	line := stopLine(reason)
	s.stopCancel(&stopError{text: line})
	cs := make([]*client, 0, len(s.clients))
	for c := range s.clients {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	defer close(s.stopped)
	s.log.Info("control: stopping", "reason", reason, "clients", len(cs))
	if s.ln != nil {
		s.ln.Close()
	}
	// Shut every client's read side: its reader still gets every line the
	// client sent before this moment, then end-of-file, so "queued" means
	// everything sent before the stop, not just what we happened to have
	// read. A client that writes after this gets EPIPE.
	for _, c := range cs {
		c.conn.CloseRead()
	}
	// Every work loop ends the reply it owes and answers what is queued,
	// until the reader ends, then reports settled. Wait for them,
	// bounded: a client that does not read must not hold up the end of
	// the sandbox.
	deadline := time.NewTimer(s.StopWait)
	defer deadline.Stop()
wait:
	for _, c := range cs {
		select {
		case <-c.settled:
		case <-deadline.C:
			s.log.Warn("control: replies still being written when the stop wait ran out; dropping their clients", "waited", s.StopWait)
			break wait
		}
	}
	for _, c := range cs {
		c.drop("sandbox stopping")
	}
	if s.ln != nil {
		s.ln.Unlink()
	}
}

func (s *Server) admit(conn *net.UnixConn) {
	uid, err := unixsock.PeerUID(conn)
	if err != nil || uid != s.uid {
		s.log.Warn("control: refused a client of another user", "peer_uid", uid, "err", err)
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write(frame.Framed("ERR permission denied: the control socket is owner-only", -1))
		conn.Close()
		return
	}
	s.mu.Lock()
	if stop, ok := s.stopText(); ok {
		// Accepted just as Stop began: told why, like any refusal.
		s.mu.Unlock()
		conn.SetWriteDeadline(time.Now().Add(time.Second))
		conn.Write(frame.Framed(stop, -1))
		conn.Close()
		return
	}
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
	s.touch()
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
	s.touch()
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
	broken bool          // a write failed: nothing more is written (under wmu)
	frame  chan struct{} // held from a relayed reply's first byte to its trailer
	work   chan job
	done   chan struct{}
	once   sync.Once
	ctx    context.Context
	cancel context.CancelCauseFunc
	// views is the client's diff state (__screendiff__, __framediff__),
	// used only from its reader.
	views views

	// settled is closed when the work loop has ended: after Stop began,
	// once it has ended the reply it owed and answered everything the
	// client sent before the stop. Stop may then close the connection.
	settled    chan struct{}
	settleOnce sync.Once
}

func newClient(s *Server, conn *net.UnixConn) *client {
	// The client's context ends when it leaves or when the session ends.
	ctx, cancel := context.WithCancelCause(s.ctx)
	return &client{
		s: s, conn: conn, frame: make(chan struct{}, 1),
		work: make(chan job, 64), done: make(chan struct{}),
		ctx: ctx, cancel: cancel, settled: make(chan struct{}),
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
		// Work cancelled because the client left ends with Canceled;
		// when the server is stopping, with the stop as its cause.
		cause := context.Cause(c.s.stopCtx)
		if cause == nil {
			cause = context.Canceled
		}
		c.cancel(cause)
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
	if c.broken {
		// A write that failed may have sent part of its bytes; anything
		// after them would be read as the wrong part of a frame.
		return net.ErrClosed
	}
	c.conn.SetWriteDeadline(time.Now().Add(c.s.WedgedAfter))
	n, err := c.conn.Write(b)
	c.s.meter.Out(n)
	if err != nil {
		c.broken = true
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

// reply writes a complete host-generated frame.
func (c *client) reply(body string, exit int) { c.replyStreamed(frame.Framed(body, exit)) }

func (c *client) errReply(format string, a ...any) {
	c.reply("ERR "+fmt.Sprintf(format, a...), -1)
}

// replyStreamed writes a whole host-generated reply (a frame, or a
// self-delimiting streamed reply), waiting briefly for the end of a
// relayed frame in progress so the two never interleave.
func (c *client) replyStreamed(b []byte) {
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
	c.write(b)
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
			if _, stopping := c.s.stopText(); stopping && errors.Is(err, io.EOF) {
				// Stop shut our read side (or the client left as it
				// began): the work loop answers what is queued, and
				// Stop closes the connection once it has.
				return
			}
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
	defer c.settle()
	for {
		select {
		case j, ok := <-c.work:
			if !ok {
				return
			}
			c.run(j)
		case <-c.s.stopCtx.Done():
			c.answerStopped()
			return
		}
	}
}

func (c *client) settle() { c.settleOnce.Do(func() { close(c.settled) }) }

// run runs one queued command and returns when its reply has ended: when
// the handler returns, or at once when Stop has ended the reply for it.
func (c *client) run(j job) {
	if stop, ok := c.s.stopText(); ok {
		c.reply(stop, -1)
		return
	}
	if c.ctx.Err() != nil {
		// The client left, or the session is ending: what was queued
		// behind the running command must not drive the guest on
		// behalf of nobody. A client still connected is told why
		// (a client that left gets nothing: its connection is closed).
		c.errReply(errStopping)
		return
	}
	t := newTask(c)
	c.s.busy.Add(1)
	c.s.touch()
	go func() {
		defer func() {
			c.s.touch()
			c.s.busy.Add(-1)
		}()
		defer t.finish()
		j.h.drive(t, j.cmd)
	}()
	select {
	case <-t.done:
	case <-c.s.stopCtx.Done():
		// The work is cancelled, but a guest that ignores that must not
		// keep the client waiting: the reply ends now, and whatever the
		// handler writes when it returns is discarded. Nothing else
		// runs on this client, so it never overlaps the next command.
		t.abort()
	}
}

// answerStopped answers, in order, every command queued behind the one
// Stop ended, with Stop's ERR, until the reader has ended (Stop shut the
// read side, so that is once the client's last line before the stop has
// been read). The work loop then reports the client settled.
func (c *client) answerStopped() {
	stop, _ := c.s.stopText()
	for range c.work {
		c.reply(stop, -1)
	}
}

// capture runs __snapshot__ or __park__. The reply comes only when the
// artifact is committed on disk. Stop does not cancel it (whether a capture
// in progress commits is the session's decision, through the root
// context), though it does end its reply.
func (t *task) capture(cmd cmdline.Command) {
	if !t.waitAgent() {
		return
	}
	c := t.c
	path := ""
	if len(cmd.Args) > 0 {
		path = cmd.Args[0]
	}
	name := verb(cmd)
	ctx, cancel := context.WithCancel(c.s.ctx)
	defer cancel()
	if cmd.Name == "__park__" {
		body, err := c.s.backend.Park(ctx, path)
		if err != nil {
			t.reply(fmt.Sprintf("ERR %s: %v", name, err), -1)
			return
		}
		t.reply(body, 0)
		c.s.backend.FinishPark()
		return
	}
	body, err := c.s.backend.Snapshot(ctx, path)
	if err != nil {
		t.reply(fmt.Sprintf("ERR %s: %v", name, err), -1)
		return
	}
	t.reply(body, 0)
}

// transfer runs __put__ or __get__. Its context ends when the client goes
// away, when the session ends and when the server stops: a transfer nobody
// waits for is abandoned, and the side that receives it cleans up the half
// it got.
func (t *task) transfer(cmd cmdline.Command, op func(context.Context, string, string) (int64, error)) {
	if !t.waitAgent() {
		return
	}
	c := t.c
	ctx, cancel := c.s.stoppable(c.ctx)
	defer cancel()
	o := c.s.beginCommand(cmd.Name + " " + strings.Join(cmd.Args, " "))
	n, err := op(ctx, cmd.Args[0], cmd.Args[1])
	o.endTransfer(n, err)
	if err != nil {
		c.s.awaitStop(err)
		t.reply(fmt.Sprintf("ERR %s: %v", verb(cmd), err), -1)
		return
	}
	c.s.meter.Command()
	t.reply(fmt.Sprintf("OK %s %d bytes", verb(cmd), n), 0)
}

// runShell relays a command: output escaped and bounded as it streams,
// then the trailer with the exit clamped to 0..255. The guest's output is
// always drained to the end, client or no client: the command's context is
// the session's root, not the client's, so a command keeps running in the
// guest when its client leaves. Stop cancels it.
//
// Only nether may produce a negative exit. A failure the guest caused (its
// agent reset the stream) therefore ends the frame with exit 255, like a
// malformed trailer, and the guest's reason goes to the log, never into an
// ERR line. A failure on the host ends it with nether's own ERR text.
func (t *task) runShell(command string) {
	if !t.waitAgent() {
		return
	}
	c := t.c
	ctx, cancel := c.s.stoppable(c.s.ctx)
	defer cancel()
	o := c.s.beginCommand(command)
	out, err := c.s.backend.Exec(ctx, command)
	if err != nil && !errors.Is(err, channel.ErrReset) {
		o.endShell(255, "failed=exec")
		t.reply(fmt.Sprintf("ERR exec: %v", err), -1)
		return
	}
	c.s.meter.Command()
	t.open()
	if err != nil {
		// The agent refused the command outright: an empty body, exit 255.
		o.endShell(255, "failed=guest_reset")
		t.guestReset(err)
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
			if t.chunk(escaped) != nil {
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
				o.endShell(255, "failed=guest_reset")
				t.guestReset(rerr)
				return
			}
			o.endShell(255, "failed=host")
			c.s.awaitStop(rerr)
			reason := hostExecFailure(rerr)
			c.s.log.Error("control: relaying a command's output failed", "err", rerr, "reply", reason)
			t.failStream(reason)
			return
		}
	}
	exit := frame.ClampExit(out.Status())
	note := ""
	if capped {
		note = "output=capped"
	}
	o.endShell(exit, note)
	t.endStream(frame.Trailer(exit))
}

// guestReset ends a streamed reply the guest agent reset: exit 255, the
// reason logged. When the server is stopping, the reset is taken for the
// stop's doing and the reply ends with Stop's ERR.
func (t *task) guestReset(err error) {
	t.c.guestReset(err)
	if _, stopping := t.c.s.stopText(); stopping {
		t.failStream("")
		return
	}
	t.endStream(frame.Trailer(255))
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
