// Package client is a Go client for the nether control socket, protocol v2
// (shared/spec/control-protocol.md).
//
// A Client holds one connection and issues one command at a time, as the
// protocol's serial request/response model requires: send a line, read its
// whole reply, then send the next. Methods are safe for concurrent use but
// are serialised.
//
// # Reply shapes
//
// Framed replies (every report, ack, shell command and control-plane
// error) are read up to the raw 0x1e<exit>\n trailer and un-escaped. A
// negative exit is a control-plane error and is returned as *ControlError.
//
// Streamed replies (__events__, __cmdlog__, __netlog__, __screen__,
// __screendiff__, __frame__, __framediff__) have no trailer and no
// escaping: each is self-delimiting by its header, and the client reads
// exactly the bytes the header announces, with no idle timer:
//
//	EVENTS <cursor> <count>[ dropped=<n>]\n  then count lines
//	CMDLOG <count>[ dropped=<n>]\n           then count lines
//	NETLOG <count>[ dropped=<n>]\n           then count lines
//	SCREEN <count> <cols> <rows> <cursor_row> <cursor_col>\n      then count lines
//	SCREENDIFF <count> <cols> <rows> <cursor_row> <cursor_col>\n  then count lines
//	P6\n<width> <height>\n255\n              then width*height*3 bytes
//	FRAMEDIFF <width> <height> <tile> <count>\n
//	                                then count of "<x> <y> <w> <h>\n" + w*h*3 bytes
//
// A streamed command that cannot run answers with a framed ERR instead
// (no payload begins with "ERR"), which is read as a frame and returned as
// *ControlError. Announced sizes are capped (MaxStreamLine and the other
// Max* constants); a reply over a cap, with an unknown header, or
// otherwise malformed is an ErrStreamFormat error and leaves the
// connection out of sync, so the Client refuses further commands. Run
// writes a streamed payload to its writer unchanged; Events, CmdLog,
// NetLog, Screen, ScreenDiff, Frame and FrameDiff decode it.
//
// # Version 1 servers
//
// Protocol v1 servers sent acks and errors as a bare "OK ..."/"ERR ..."
// line without a trailer. When the __info__ handshake reports
// proto_version=1 (or none), a reply whose first line starts with "OK" or
// "ERR" and is not followed by a 0x1e or any further byte within the settle
// window (500 ms) is taken as complete: exit 0 for OK, -1 for ERR. This is
// the same heuristic as the reference client and it has the same known
// flaw, which is why v2 removed it: a shell command whose output begins
// with OK/ERR and pauses for longer than the settle window before its
// trailer is cut short, and the rest of its reply is then read as the next
// reply. Against v2 servers the heuristic is never used.
package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/frame"
)

const (
	// V1Settle is how long a bare v1 "OK"/"ERR" line must be followed by
	// silence to count as a complete reply.
	V1Settle = 500 * time.Millisecond

	// bodySlack is added to the server's max_output_bytes for the default
	// body limit: the server inserts a "...[output capped]" marker on top
	// of the cap, and a little headroom costs nothing.
	bodySlack = 64 << 10
	// defaultMaxOutput is the server's documented default cap, assumed when
	// __info__ does not report one.
	defaultMaxOutput = 1 << 20
	// maxHeld bounds how much of a body that starts with "ERR" is held back
	// while deciding whether it is a control-plane error line.
	maxHeld = 4 << 10
)

// ErrTruncated is wrapped by Run when the reply body exceeded the limit set
// with SetMaxBody. The excess was read and discarded, so the exit code is
// valid and the connection stays usable.
var ErrTruncated = errors.New("reply body exceeded the client limit; excess discarded")

// ErrInvalidCommand is wrapped by Run for a line that cannot be sent
// safely: an embedded newline would be read by the server as a second
// command, and 0x1e/0x1f/NUL are refused by the server anyway.
var ErrInvalidCommand = errors.New("invalid command line")

// ControlError is a control-plane error: nether itself rejected or failed
// the command and replied with a negative exit and an ERR line.
type ControlError struct {
	Exit int
	// Msg is the ERR line without its line terminator, e.g.
	// "ERR agent not connected (guest not ready)".
	Msg string
}

func (e *ControlError) Error() string {
	msg := e.Msg
	if msg == "" {
		msg = "(no message)"
	}
	return fmt.Sprintf("nether control error (exit %d): %s", e.Exit, msg)
}

// Client is a connection to one nether control socket.
type Client struct {
	mu     sync.Mutex // serialises commands
	conn   net.Conn
	br     *bufio.Reader
	fr     *frame.Reader
	info   map[string]string
	proto  int
	broken error // set once the stream is out of sync or gone

	// dmu orders deadline changes against cancellation, so restoring a
	// deadline after a short idle wait can never undo the expired
	// deadline that cancellation set.
	dmu      sync.Mutex
	canceled bool
}

// Dial connects to the control socket at socketPath and performs the
// __info__ handshake. ctx bounds the whole dial and handshake.
func Dial(ctx context.Context, socketPath string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("client: connecting to %s: %w", socketPath, err)
	}
	c := newClient(conn)
	if err := c.handshake(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("client: __info__ handshake on %s: %w", socketPath, err)
	}
	return c, nil
}

func newClient(conn net.Conn) *Client {
	br := bufio.NewReaderSize(conn, 64<<10)
	return &Client{
		conn: conn,
		br:   br,
		fr:   frame.NewReader(br, -1),
	}
}

func (c *Client) handshake(ctx context.Context) error {
	var buf bytes.Buffer
	// The protocol version is not known yet. __info__ is framed in every
	// version, but an early rejection (too many clients) may be a bare v1
	// line, so read with the v1-tolerant path; a normal report does not
	// start with OK/ERR and never waits for the settle window.
	_, err := c.run(ctx, "__info__", &buf, readSettle)
	if err != nil {
		return err
	}
	c.info = parseReport(buf.String())
	c.proto = 1
	if v, err := strconv.Atoi(c.info["proto_version"]); err == nil && v > 0 {
		c.proto = v
	}
	limit := int64(defaultMaxOutput)
	if v, ok := c.info["max_output_bytes"]; ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			limit = n
		}
	}
	if limit == 0 {
		c.fr.Limit = -1
	} else {
		c.fr.Limit = limit + bodySlack
	}
	return nil
}

// parseReport parses "key=value" lines; other lines are ignored so a
// newer server can add free-form text without breaking old clients.
func parseReport(body string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(body, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && k != "" {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}

// Info returns a copy of the key=value pairs of the handshake __info__
// report.
func (c *Client) Info() map[string]string {
	m := make(map[string]string, len(c.info))
	for k, v := range c.info {
		m[k] = v
	}
	return m
}

// ProtoVersion is the server's proto_version (1 when it did not say).
func (c *Client) ProtoVersion() int { return c.proto }

// SetMaxBody caps the framed reply body delivered by Run to n bytes; the
// rest is read and discarded so the next reply stays in sync (the server
// always sends the trailer, even for a runaway command). n <= 0 means
// unlimited, matching max_output_bytes=0 in nether.conf. The default is
// the server's max_output_bytes plus slack. Streamed replies are not
// subject to it: they are bounded by the Max* limits of their shapes.
func (c *Client) SetMaxBody(n int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n <= 0 {
		n = -1
	}
	c.fr.Limit = n
}

// Close closes the connection. It may be called concurrently with Run to
// abort it. Disconnecting never affects the running sandbox.
func (c *Client) Close() error {
	return c.conn.Close()
}

// Query runs a report command such as __info__, __stats__ or __help__ and
// returns its body. A non-zero exit is an error.
func (c *Client) Query(ctx context.Context, name string) (string, error) {
	var buf bytes.Buffer
	exit, err := c.Run(ctx, name, &buf)
	if err != nil {
		return buf.String(), err
	}
	if exit != 0 {
		return buf.String(), fmt.Errorf("client: %s exited %d", name, exit)
	}
	return buf.String(), nil
}

// Run sends one command line and streams the un-escaped reply body to out
// (nil discards it) as it arrives, returning the exit code: the guest
// command's 0..255, or a negative control-plane code together with a
// *ControlError. The ERR line of a control-plane error is reported only in
// the ControlError, not written to out. A streamed command's payload is
// written to out byte for byte, header included, and its exit is 0.
//
// ctx's deadline is applied to the socket; cancelling ctx aborts the read.
// An aborted or failed read leaves the reply half-consumed, so the Client
// refuses further commands; reconnect with Dial (the sandbox is unaffected).
func (c *Client) Run(ctx context.Context, line string, out io.Writer) (exit int, err error) {
	line = strings.TrimSuffix(line, "\n")
	if strings.ContainsAny(line, "\n\x1e\x1f\x00") {
		return 0, fmt.Errorf("client: %w: contains a newline, NUL or frame delimiter byte (0x1e/0x1f)", ErrInvalidCommand)
	}
	mode := readFramed
	if tok, _, _ := strings.Cut(strings.TrimSpace(line), " "); tok != "" {
		// The table knows every verb of the protocol, including those a
		// given server does not serve: an unserved one answers a framed
		// ERR, which the streamed read recognises.
		if spec, ok := cmdline.Lookup(tok); ok && spec.Reply == cmdline.Streamed {
			mode = readStreamed
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if mode == readFramed && c.proto <= 1 {
		mode = readSettle
	}
	return c.run(ctx, line, out, mode)
}

// ErrControlLine is wrapped (with ErrInvalidCommand) by Shell for a line
// nether would read as one of its own control verbs.
var ErrControlLine = errors.New("the line begins with __, nether's reserved control namespace")

// Shell runs line as a shell command in the guest and nothing else: a
// line nether would read as a control verb (it begins with "__" once
// trimmed) is refused before anything is sent, wrapping ErrControlLine and
// ErrInvalidCommand. A platform that forwards its tenants' commands calls
// Shell, never Run, so a tenant cannot snapshot, park, shut down or move
// files through the sandbox's control socket. To run a guest program
// whose name begins with "__", quote it or give its path ("./__x").
func (c *Client) Shell(ctx context.Context, line string, out io.Writer) (exit int, err error) {
	if cmdline.IsControlLine(line) {
		return 0, fmt.Errorf("client: %w: %w (to run such a program in the guest, quote it or give its path: ./__name)", ErrInvalidCommand, ErrControlLine)
	}
	return c.Run(ctx, line, out)
}

type readMode int

const (
	readFramed   readMode = iota // v2: read to the trailer
	readSettle                   // v1: bare OK/ERR line or frame
	readStreamed                 // no trailer: read by the header
)

// run does one request/response exchange; c.mu must be held.
func (c *Client) run(ctx context.Context, line string, out io.Writer, mode readMode) (int, error) {
	if c.broken != nil {
		return 0, fmt.Errorf("client: connection unusable after an earlier error: %w", c.broken)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	dl, _ := ctx.Deadline()
	c.dmu.Lock()
	c.canceled = false
	err := c.conn.SetDeadline(dl)
	c.dmu.Unlock()
	if err != nil {
		return 0, c.fail(ctx, fmt.Errorf("setting deadline: %w", err))
	}
	// Cancellation has no socket equivalent; an expired deadline is the
	// only way to unblock a pending read or write.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.dmu.Lock()
		c.canceled = true
		c.conn.SetDeadline(time.Unix(1, 0))
		c.dmu.Unlock()
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
		}
	}()

	if _, err := io.WriteString(c.conn, line+"\n"); err != nil {
		// A server that refuses a client (too many clients, another uid)
		// writes its framed ERR and closes at once, possibly before our
		// command leaves: the reply already waiting says more than EPIPE.
		if ce := c.pendingRefusal(); ce != nil {
			c.broken = ce
			return ce.Exit, ce
		}
		return 0, c.fail(ctx, fmt.Errorf("sending command: %w", err))
	}

	w := &replyWriter{out: out, holding: true}
	if out == nil {
		w.out = io.Discard
	}
	var res frame.Result
	switch mode {
	case readFramed:
		res, err = c.fr.Next(w)
	case readSettle:
		res, err = c.readSettle(ctx, dl, w)
	case readStreamed:
		res, err = c.readStreamed(ctx, dl, line, out, w)
	}
	if err != nil {
		return 0, c.fail(ctx, fmt.Errorf("reading reply: %w", err))
	}
	w.finish(res.Exit)
	if res.WriteErr == nil {
		res.WriteErr = w.err
	}
	if res.Exit < 0 {
		return res.Exit, &ControlError{Exit: res.Exit, Msg: w.firstLine()}
	}
	if res.WriteErr != nil {
		return res.Exit, fmt.Errorf("client: writing reply body: %w", res.WriteErr)
	}
	if res.Discarded > 0 {
		return res.Exit, fmt.Errorf("client: %w (%d bytes)", ErrTruncated, res.Discarded)
	}
	return res.Exit, nil
}

// pendingRefusal reads a framed control error the server sent before it
// closed the connection, if there is one.
func (c *Client) pendingRefusal() *ControlError {
	c.setReadDeadline(time.Now().Add(time.Second))
	var body bytes.Buffer
	res, err := c.fr.Next(&body)
	if err != nil || res.Exit >= 0 {
		return nil
	}
	return &ControlError{Exit: res.Exit, Msg: strings.TrimRight(body.String(), "\n")}
}

// fail records a stream-level failure, translating socket deadline errors
// into the context error that caused them.
func (c *Client) fail(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w (%w)", ctxErr, err)
	} else if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) && errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	c.broken = err
	return fmt.Errorf("client: %w", err)
}

// isIdleTimeout reports whether err is a socket timeout from a short idle
// deadline we set, as opposed to ctx's own deadline or cancellation.
func isIdleTimeout(ctx context.Context, dl time.Time, err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || ctx.Err() != nil {
		return false
	}
	return dl.IsZero() || time.Now().Before(dl)
}

// withReadDeadline sets the read deadline to now+d, capped by ctx's
// deadline; restore puts back the ctx deadline.
func (c *Client) withReadDeadline(dl time.Time, d time.Duration) (restore func()) {
	t := time.Now().Add(d)
	if !dl.IsZero() && dl.Before(t) {
		t = dl
	}
	c.setReadDeadline(t)
	return func() { c.setReadDeadline(dl) }
}

func (c *Client) setReadDeadline(t time.Time) {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if c.canceled {
		return
	}
	c.conn.SetReadDeadline(t)
}

func statusPrefixCompatible(b []byte) bool {
	for _, p := range [][]byte{[]byte("OK"), []byte("ERR")} {
		if bytes.HasPrefix(b, p) || bytes.HasPrefix(p, b) {
			return true
		}
	}
	return false
}

// readSettle implements the v1 compatibility read (see the package
// documentation). It only peeks until it has decided, so a reply that
// turns out to be framed is then read by the ordinary frame reader from
// its first byte.
func (c *Client) readSettle(ctx context.Context, dl time.Time, w io.Writer) (frame.Result, error) {
	for {
		if _, err := c.br.Peek(1); err != nil {
			return frame.Result{}, eofToUnexpected(err)
		}
		buf, _ := c.br.Peek(c.br.Buffered())
		if !statusPrefixCompatible(buf) {
			return c.fr.Next(w)
		}
		nl := bytes.IndexByte(buf, '\n')
		if bytes.IndexByte(buf, frame.Delim) >= 0 && (nl < 0 || bytes.IndexByte(buf[:nl], frame.Delim) >= 0) {
			return c.fr.Next(w)
		}
		if nl < 0 {
			if len(buf) >= c.br.Size() {
				return c.fr.Next(w) // far too long for a status line
			}
			if _, err := c.br.Peek(len(buf) + 1); err != nil {
				return frame.Result{}, eofToUnexpected(err)
			}
			continue
		}
		if len(buf) < 3 || !bytes.HasPrefix(buf, []byte("OK")) && !bytes.HasPrefix(buf, []byte("ERR")) {
			return c.fr.Next(w) // e.g. "O\n": not a status line
		}
		if len(buf) > nl+1 {
			return c.fr.Next(w) // more already arrived: part of a frame
		}
		restore := c.withReadDeadline(dl, V1Settle)
		_, err := c.br.Peek(nl + 2)
		restore()
		switch {
		case err == nil:
			return c.fr.Next(w)
		case isIdleTimeout(ctx, dl, err) || err == io.EOF:
			// Settled: a bare v1 status line.
			exit := 0
			if bytes.HasPrefix(buf, []byte("ERR")) {
				exit = -1
			}
			line := append([]byte(nil), buf[:nl+1]...)
			c.br.Discard(nl + 1)
			n, werr := w.Write(line)
			return frame.Result{Exit: exit, Written: int64(n), WriteErr: werr}, nil
		default:
			return frame.Result{}, err
		}
	}
}

// readStreamed reads a trailer-less reply by its header (see the package
// documentation), writing its bytes unchanged to out. A reply starting
// with "ERR" is the framed (or, from a v1 server, bare) error of a
// streamed command that could not run; it is read into w, which holds the
// ERR line back from the caller.
func (c *Client) readStreamed(ctx context.Context, dl time.Time, line string, out, w io.Writer) (frame.Result, error) {
	head, err := c.br.Peek(3)
	if err != nil {
		return frame.Result{}, eofToUnexpected(err)
	}
	if string(head) == "ERR" {
		if c.proto <= 1 {
			return c.readSettle(ctx, dl, w)
		}
		return c.fr.Next(w)
	}
	verb, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	p, err := readPayload(c.br, out, streamHeaders[verb])
	if err != nil {
		return frame.Result{}, err
	}
	return frame.Result{Written: p.consumed, WriteErr: p.writeErr}, nil
}

func eofToUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// replyWriter forwards the body to the caller's writer, except that a body
// beginning with "ERR" is held back (up to maxHeld bytes, and only while
// it is still a single line) until the exit code shows whether it is a
// control-plane error. It also keeps the first line for ControlError.Msg.
type replyWriter struct {
	out     io.Writer
	holding bool
	held    []byte
	head    []byte
	err     error
}

func (w *replyWriter) Write(p []byte) (int, error) {
	if w.err != nil {
		return 0, w.err
	}
	if room := 1024 - len(w.head); room > 0 {
		w.head = append(w.head, p[:min(room, len(p))]...)
	}
	if !w.holding {
		return w.write(p)
	}
	w.held = append(w.held, p...)
	if w.mayBeErrLine() {
		return len(p), nil
	}
	w.holding = false
	held := w.held
	w.held = nil
	if _, err := w.write(held); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *replyWriter) write(p []byte) (int, error) {
	n, err := w.out.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	w.err = err
	return n, err
}

func (w *replyWriter) mayBeErrLine() bool {
	h := w.held
	if len(h) < 3 {
		return bytes.HasPrefix([]byte("ERR"), h)
	}
	if !bytes.HasPrefix(h, []byte("ERR")) || len(h) > maxHeld {
		return false
	}
	nl := bytes.IndexByte(h, '\n')
	return nl < 0 || nl == len(h)-1
}

// finish releases held bytes unless the reply was a control-plane error.
func (w *replyWriter) finish(exit int) {
	if w.holding && exit >= 0 && len(w.held) > 0 && w.err == nil {
		w.write(w.held)
	}
	w.holding = false
	w.held = nil
}

func (w *replyWriter) firstLine() string {
	line, _, _ := strings.Cut(string(w.head), "\n")
	return strings.TrimRight(line, "\r")
}
