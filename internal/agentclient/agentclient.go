// Package agentclient is the host's side of the conversation with the
// in-guest agent, over the channel: commands, file transfers, the
// post-restore handshake, power-off, and a dispatcher for the streams the
// guest opens, keyed by kind. It knows agentproto and the channel, nothing
// about engines or the control socket.
package agentclient

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// Client talks to one agent.
type Client struct {
	log *slog.Logger
	mux *channel.Mux

	mu       sync.Mutex
	epoch    uint64 // the session epoch every request carries
	handlers map[string]Handler

	up     chan struct{}
	upOnce sync.Once
	// bad is closed when the agent cannot be driven (it speaks another
	// protocol version); badErr says why.
	bad     chan struct{}
	badOnce sync.Once
	badErr  error
	// provisionReq, when set, is sent after a boot's hello (SetProvision).
	provisionReq *agentproto.Request

	// StallTimeout overrides DefaultStallTimeout; set before use.
	StallTimeout time.Duration
}

// Handler serves a stream the guest opened. It owns the stream.
type Handler func(ctx context.Context, st *channel.Stream, req agentproto.Request)

// New returns a client on mux serving session epoch (0 for a boot).
func New(log *slog.Logger, mux *channel.Mux, epoch uint64) *Client {
	c := &Client{log: log, mux: mux, epoch: epoch, handlers: map[string]Handler{}, up: make(chan struct{}), bad: make(chan struct{}),
		StallTimeout: DefaultStallTimeout}
	c.Handle(agentproto.OpHello, c.hello)
	return c
}

// Handle registers the handler for guest-opened streams of kind op.
// Streams of a kind nobody handles are refused.
func (c *Client) Handle(op string, h Handler) {
	c.mu.Lock()
	c.handlers[op] = h
	c.mu.Unlock()
}

// Up is closed once the agent is known to be serving this session: its
// hello after a boot, or a completed handshake after a restore.
func (c *Client) Up() <-chan struct{} { return c.up }

func (c *Client) markUp() { c.upOnce.Do(func() { close(c.up) }) }

// WaitUp blocks until the agent is up or ctx ends. It fails at once for
// an agent that cannot be driven.
func (c *Client) WaitUp(ctx context.Context) error {
	select {
	case <-c.up:
		return nil
	case <-c.bad:
		return c.badErr
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Serve dispatches the streams the guest opens until ctx ends or the
// channel closes.
func (c *Client) Serve(ctx context.Context) {
	for {
		st, err := c.mux.Accept(ctx)
		if err != nil {
			return
		}
		req, err := agentproto.Decode(st.Meta())
		if err != nil {
			st.Reset("the host does not accept this stream")
			continue
		}
		c.mu.Lock()
		h := c.handlers[req.Op]
		c.mu.Unlock()
		if h == nil {
			st.Reset("the host does not accept this stream")
			continue
		}
		go h(ctx, st, req)
	}
}

func (c *Client) hello(_ context.Context, st *channel.Stream, req agentproto.Request) {
	c.log.Info("agent connected", "boot", req.Boot, "agent_version", req.Version,
		"guest_agent_start_ms", req.StartMS, "guest_modules_done_ms", req.ModulesMS, "guest_hello_ms", req.HelloMS)
	st.CloseWrite(nil)
	go io.Copy(io.Discard, st)
	if req.Version != agentproto.Version {
		// Every request would be misread: an older agent takes a base64
		// command line for the command itself. Refuse to drive it.
		c.refuse(fmt.Errorf("the guest agent speaks agent protocol %d, this nether speaks %d: rebuild the guest image (scripts/setup.sh)", req.Version, agentproto.Version))
		return
	}
	if req.DiskProblem != "" {
		c.refuse(&DiskError{Problem: agentproto.Printable(req.DiskProblem, 1024)})
		return
	}
	if req.Problem != "" {
		// The guest is not what nether.conf asked for (a run_as user it
		// does not know, a disk it could not mount): running commands in
		// it anyway would run them another way than asked.
		c.refuse(fmt.Errorf("the guest could not be set up as nether.conf asks: %s", agentproto.Printable(req.Problem, 1024)))
		return
	}
	if c.provisionReq != nil {
		// The guest takes its identity and secrets before anything may
		// run in it: up waits for them.
		if err := c.provision(context.Background(), *c.provisionReq); err != nil {
			c.refuse(err)
			return
		}
	}
	c.markUp()
}

// DiskError is why WaitUp refuses a guest that could not mount its
// persistent disk (hello's DiskProblem): nothing a command does mends the
// disk, so the session ends the sandbox, naming its own file.
type DiskError struct {
	// Problem is the rest of a sentence whose subject is the disk ("is
	// not a usable ext4 file system: ..."), in the guest's words.
	Problem string
}

func (e *DiskError) Error() string { return "the guest's persistent disk " + e.Problem }

// refuse marks the agent as one that cannot be driven, for why: WaitUp
// answers with it from then on.
func (c *Client) refuse(why error) {
	c.badOnce.Do(func() {
		c.badErr = why
		c.log.Error("refusing to drive the guest agent", "err", why)
		close(c.bad)
	})
}

// SetProvision has the client hand a booted guest req's identity and
// secrets (OpProvision) after its hello, before Up: no command runs in a
// guest that does not yet hold them. Call it before Serve.
func (c *Client) SetProvision(req agentproto.Request) { c.provisionReq = &req }

// provision sends OpProvision and waits for the agent to confirm.
func (c *Client) provision(ctx context.Context, req agentproto.Request) error {
	ctx, cancel := context.WithTimeout(ctx, c.StallTimeout)
	defer cancel()
	req.Op, req.RealtimeNS = agentproto.OpProvision, now().UnixNano()
	return c.ask(ctx, req, "handing the guest its identity and secrets", "ok 0 "+agentproto.Provisioned)
}

// Provision hands a running guest its secrets (and identity, when req
// has one) again: after a capture withdrew them (Withdraw).
func (c *Client) Provision(ctx context.Context, req agentproto.Request) error {
	return c.provision(ctx, req)
}

// Withdraw has the agent empty /run/secrets, zeroing each file before it
// removes it (OpWithdraw): what a base capture does first, so that the
// memory it saves holds none of the secrets the agent wrote.
func (c *Client) Withdraw(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, c.StallTimeout)
	defer cancel()
	return c.ask(ctx, agentproto.Request{Op: agentproto.OpWithdraw}, "withdrawing the guest's secrets", "ok 0 "+agentproto.Withdrawn)
}

// ask sends req, stamped with the session epoch, with no payload, and
// waits for the agent to close it with the status want; doing names the
// request in errors.
func (c *Client) ask(ctx context.Context, req agentproto.Request, doing, want string) error {
	st, err := c.open(req)
	if err != nil {
		return err
	}
	st.CloseWrite(nil)
	if _, err := drain(ctx, st); err != nil {
		st.Reset("host gave up on the " + req.Op)
		return fmt.Errorf("%s: %w", doing, AgentError(err))
	}
	if got := string(st.Status()); got != want {
		return fmt.Errorf("%s: agent answered %q, want %q", doing, truncate(got, 80), want)
	}
	return nil
}

// open starts a request stream stamped with the session epoch.
func (c *Client) open(req agentproto.Request) (*channel.Stream, error) {
	c.mu.Lock()
	req.Epoch = c.epoch
	c.mu.Unlock()
	return c.mux.Open(req.Encode())
}

// Exec starts a shell command; its output is the stream, its exit status
// the stream's close status.
func (c *Client) Exec(ctx context.Context, command string) (*channel.Stream, error) {
	st, err := c.open(agentproto.Request{Op: agentproto.OpExec, Command: agentproto.Text(command)})
	if err != nil {
		return nil, err
	}
	st.CloseWrite(nil)
	return st, nil
}

// DefaultStallTimeout is how long a transfer may make no progress before
// it is cancelled: a guest that stops reading, or a guest file whose reads
// block forever, must not pin the sandbox.
const DefaultStallTimeout = 30 * time.Second

// ErrTooLarge is returned by a transfer past its limit.
var ErrTooLarge = errors.New("over the transfer limit")

// Put streams r into guestPath (created with mode), at most max bytes (0 =
// unlimited). The agent renames the file into place only when every byte
// arrived.
func (c *Client) Put(ctx context.Context, r io.Reader, mode uint32, guestPath string, max int64) (int64, error) {
	st, err := c.open(agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(guestPath), Mode: mode, Max: max})
	if err != nil {
		return 0, err
	}
	ctx, done := withStall(ctx, c.StallTimeout)
	defer done()
	if max > 0 {
		r = &limitReader{r: r, left: max}
	}
	n, err := copyContext(ctx, st, r)
	if errors.Is(err, channel.ErrReset) {
		return 0, AgentError(err)
	}
	if err != nil {
		st.Reset("host gave up: " + err.Error())
		if errors.Is(err, ErrTooLarge) {
			return 0, fmt.Errorf("%w of %d bytes", ErrTooLarge, max)
		}
		return 0, transferErr(ctx, err)
	}
	st.CloseWrite([]byte(fmt.Sprint(n)))
	if _, err := drain(ctx, st); err != nil {
		st.Reset("host gave up")
		return 0, transferErr(ctx, AgentError(err))
	}
	got, err := agentproto.ParseOKStatus(st.Status())
	if err != nil {
		return 0, err
	}
	if got != n {
		return 0, fmt.Errorf("guest stored %d bytes of %d", got, n)
	}
	return n, nil
}

// Get streams guestPath into w, at most max bytes (0 = unlimited), and
// returns how many bytes arrived; it is an error unless the agent's
// declared length matches.
func (c *Client) Get(ctx context.Context, guestPath string, w io.Writer, max int64) (int64, error) {
	st, err := c.open(agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(guestPath), Max: max})
	if err != nil {
		return 0, err
	}
	st.CloseWrite(nil)
	ctx, done := withStall(ctx, c.StallTimeout)
	defer done()
	if max > 0 {
		w = &limitWriter{w: w, left: max}
	}
	n, err := copyFromStream(ctx, w, st)
	if err != nil {
		st.Reset("host gave up: " + err.Error())
		if errors.Is(err, ErrTooLarge) {
			return n, fmt.Errorf("%w of %d bytes", ErrTooLarge, max)
		}
		return n, transferErr(ctx, AgentError(err))
	}
	want, err := agentproto.ParseOKStatus(st.Status())
	if err != nil || want != n {
		return n, fmt.Errorf("transfer incomplete: got %d bytes, guest declared %q", n, st.Status())
	}
	return n, nil
}

// Handshake tells the agent it now serves a new session: the single place
// where a restored guest learns it is new. It picks a fresh random epoch,
// which every later request carries, so a request meant for an older
// session can never run in this one. Driving commands wait for it.
//
// req's Identity and Secrets travel in the same request. provisioned
// says whether the agent wrote them: one from before identity delivery
// (a guest captured by an older nether) answers without doing so, which
// is refused when req carries secrets and left to the caller otherwise.
func (c *Client) Handshake(ctx context.Context, req agentproto.Request) (provisioned bool, err error) {
	epoch := newEpoch()
	// The host's clock as late as possible: the guest's wall clock is set
	// from it, and a restored guest's shows its capture's moment until it is.
	req.Op, req.Epoch, req.RealtimeNS = agentproto.OpRestored, epoch, now().UnixNano()
	st, err := c.mux.Open(req.Encode())
	if err != nil {
		return false, err
	}
	st.CloseWrite(nil)
	if _, err := drain(ctx, st); err != nil {
		st.Reset("host gave up on the handshake")
		return false, fmt.Errorf("post-restore handshake: %w", AgentError(err))
	}
	ok := fmt.Sprintf("ok %d", epoch)
	switch string(st.Status()) {
	case ok + " " + agentproto.Provisioned:
		provisioned = true
	case ok:
		if len(req.Secrets) > 0 {
			return false, errors.New("post-restore handshake: the restored guest's agent predates secret delivery (agent protocol 7) and did not take the secrets; capture the snapshot again with this nether's guest image")
		}
	default:
		return false, fmt.Errorf("post-restore handshake: agent answered %q, want %q", truncate(string(st.Status()), 80), ok)
	}
	c.mu.Lock()
	c.epoch = epoch
	c.mu.Unlock()
	c.markUp()
	return provisioned, nil
}

// Epoch is the session epoch the client stamps its requests with.
func (c *Client) Epoch() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// PowerOff asks the agent to power the guest off and waits (until ctx
// ends) for the agent to acknowledge; the engine's end says when the
// power-off happened. An error means the guest did not answer.
func (c *Client) PowerOff(ctx context.Context) error {
	st, err := c.open(agentproto.Request{Op: agentproto.OpPoweroff})
	if err != nil {
		return err
	}
	if err := st.CloseWrite(nil); err != nil {
		return err
	}
	if _, err := drain(ctx, st); err != nil {
		return err
	}
	return nil
}

// AgentError turns a stream reset into the agent's own message.
func AgentError(err error) error {
	if errors.Is(err, channel.ErrReset) {
		return errors.New(strings.TrimPrefix(err.Error(), channel.ErrReset.Error()+": "))
	}
	return err
}

func newEpoch() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if e := binary.LittleEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// errStalled cancels a transfer that made no progress for its stall
// timeout.
var errStalled = errors.New("transfer stalled")

// withStall returns a context cancelled when the transfer makes no
// progress for StallTimeout; every read or write that moves bytes calls
// the progress function stored in it.
func withStall(parent context.Context, stall time.Duration) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(parent)
	t := time.AfterFunc(stall, func() { cancel(fmt.Errorf("%w: no progress for %s", errStalled, stall)) })
	ctx = context.WithValue(ctx, progressKey{}, func() { t.Reset(stall) })
	return ctx, func() {
		t.Stop()
		cancel(nil)
	}
}

type progressKey struct{}

func progress(ctx context.Context) {
	if f, ok := ctx.Value(progressKey{}).(func()); ok {
		f()
	}
}

// transferErr names why a transfer's context ended, if it did.
func transferErr(ctx context.Context, err error) error {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errStalled):
		return cause
	case cause != nil:
		return fmt.Errorf("transfer cancelled: %w", cause)
	}
	return err
}

type limitReader struct {
	r    io.Reader
	left int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.left <= 0 {
		// One byte more than allowed tells a file at the limit from one
		// past it.
		var b [1]byte
		if n, _ := l.r.Read(b[:]); n > 0 {
			return 0, ErrTooLarge
		}
		return 0, io.EOF
	}
	if int64(len(p)) > l.left {
		p = p[:l.left]
	}
	n, err := l.r.Read(p)
	l.left -= int64(n)
	return n, err
}

type limitWriter struct {
	w    io.Writer
	left int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.left {
		return 0, ErrTooLarge
	}
	l.left -= int64(len(p))
	return l.w.Write(p)
}

func drain(ctx context.Context, st *channel.Stream) (int64, error) {
	return copyFromStream(ctx, io.Discard, st)
}

// copyFromStream copies until end of stream, giving up when ctx ends.
func copyFromStream(ctx context.Context, w io.Writer, st *channel.Stream) (int64, error) {
	// A read takes whatever has arrived, up to the buffer, across frames:
	// a large buffer means fewer writes to w when the guest is ahead.
	buf := make([]byte, 256<<10)
	var n int64
	for {
		k, err := st.ReadContext(ctx, buf)
		if k > 0 {
			progress(ctx)
			if _, werr := w.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// copyContext copies r into the stream, giving up when ctx ends. Each
// read goes straight into the payload of the frame that carries it.
func copyContext(ctx context.Context, st *channel.Stream, r io.Reader) (int64, error) {
	var n int64
	for {
		var rerr error
		k, err := st.WriteFrom(ctx, func(p []byte) (int, error) {
			var k int
			k, rerr = r.Read(p)
			return k, rerr
		})
		if k > 0 {
			progress(ctx)
			n += int64(k)
		}
		switch {
		case err == nil:
		case err != rerr:
			return n, err // the stream's error, not the reader's
		case err == io.EOF:
			return n, nil
		case errors.Is(err, ErrTooLarge):
			return n, err
		default:
			return n, fmt.Errorf("reading: %w", err)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
