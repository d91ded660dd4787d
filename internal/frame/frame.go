// Package frame implements the reply framing of the nether control protocol
// (v2): a reply body is delimiter-escaped so that a raw Delim byte can only
// ever mark the trailer "\x1e<exit>\n" that ends the frame.
//
// The escape exists because command output is untrusted: without it a
// workload printing "\x1e0\n" could forge an early trailer and desynchronise
// every later reply on the socket. See "Output framing" in
// shared/spec/control-protocol.md.
package frame

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
)

const (
	// Delim is the raw byte that starts a frame trailer. It never appears
	// unescaped in a body.
	Delim = 0x1e
	// Esc leads a two-byte escape: Esc, original^0x40.
	Esc = 0x1f

	// escXor turns Delim/Esc into the printable '^'/'_' and back.
	escXor = 0x40

	// maxTrailerText bounds the exit text between Delim and '\n'. Any real
	// exit fits easily ("-2147483648" is 11 bytes); the bound stops a hostile
	// or broken peer from making us buffer an unbounded "trailer".
	maxTrailerText = 12
)

// ErrMalformedTrailer is wrapped by ReadFrame errors caused by a trailer
// that is not "<optional '-'><digits>\n". After such an error the stream is
// out of sync and the connection should be dropped.
var ErrMalformedTrailer = errors.New("frame: malformed trailer")

// AppendEscaped appends body to dst with every Delim/Esc byte replaced by
// Esc, b^0x40, and returns the extended slice.
func AppendEscaped(dst, body []byte) []byte {
	start := 0
	for i, b := range body {
		if b == Delim || b == Esc {
			dst = append(dst, body[start:i]...)
			dst = append(dst, Esc, b^escXor)
			start = i + 1
		}
	}
	return append(dst, body[start:]...)
}

// Unescaper is the streaming inverse of AppendEscaped. It keeps state
// across calls, so an Esc that ends one chunk is applied to the first byte
// of the next. The zero value is ready to use.
//
// Unescaper does not look for Delim: framing happens before un-escaping,
// so callers feed it only body bytes.
type Unescaper struct {
	pending bool // the previous chunk ended with an unconsumed Esc
}

// Append appends the un-escaped form of chunk to dst and returns the
// extended slice.
func (u *Unescaper) Append(dst, chunk []byte) []byte {
	i := 0
	if u.pending && len(chunk) > 0 {
		dst = append(dst, chunk[0]^escXor)
		u.pending = false
		i = 1
	}
	start := i
	for ; i < len(chunk); i++ {
		if chunk[i] != Esc {
			continue
		}
		dst = append(dst, chunk[start:i]...)
		if i+1 == len(chunk) {
			u.pending = true
			return dst
		}
		i++
		dst = append(dst, chunk[i]^escXor)
		start = i + 1
	}
	return append(dst, chunk[start:]...)
}

// Pending reports whether the input so far ended in the middle of an
// escape. At the end of a body that means the sender was malformed; the
// dangling Esc is dropped.
func (u *Unescaper) Pending() bool { return u.pending }

// Reset forgets any pending escape so the Unescaper can start a new body.
func (u *Unescaper) Reset() { u.pending = false }

// Trailer returns the frame trailer for exit: Delim, the decimal exit, '\n'.
func Trailer(exit int) []byte {
	b := make([]byte, 0, 8)
	b = append(b, Delim)
	b = strconv.AppendInt(b, int64(exit), 10)
	return append(b, '\n')
}

// ClampExit turns the exit text of a guest-agent trailer into the exit the
// host relays. The agent is untrusted and negative exits are reserved for
// nether's own control-plane errors, so only the canonical spelling of
// 0..255 passes; everything else becomes 255. Being strict about the
// spelling (no "+1", "007", " 1") also keeps the relayed bytes identical to
// what the agent sent whenever it is accepted.
func ClampExit(raw []byte) int {
	if len(raw) == 0 || len(raw) > 3 {
		return 255
	}
	if len(raw) > 1 && raw[0] == '0' {
		return 255
	}
	v := 0
	for _, c := range raw {
		if c < '0' || c > '9' {
			return 255
		}
		v = v*10 + int(c-'0')
	}
	if v > 255 {
		return 255
	}
	return v
}

// Framed builds a complete host-generated reply: the escaped body, a
// newline if the body is non-empty and lacks one (so the trailer starts on
// its own line for human readers), then the trailer. Host bodies should
// never contain Delim, but they are escaped anyway so that echoing a
// hostile argument into a report can never forge a frame.
func Framed(body string, exit int) []byte {
	out := make([]byte, 0, len(body)+8)
	out = AppendEscaped(out, []byte(body))
	if len(body) > 0 && body[len(body)-1] != '\n' {
		out = append(out, '\n')
	}
	return append(out, Trailer(exit)...)
}

// Result describes one frame consumed by Reader.Next.
type Result struct {
	// Exit is the trailer's exit code as sent (negative means a nether
	// control-plane error).
	Exit int
	// Written is the number of un-escaped body bytes delivered to the body
	// writer.
	Written int64
	// Discarded is the number of un-escaped body bytes dropped because
	// they exceeded the limit (or because the body writer failed).
	Discarded int64
	// WriteErr is the first error returned by the body writer. The frame
	// was still read to its trailer, so the stream remains in sync.
	WriteErr error
}

// Reader reads successive frames from a buffered stream.
type Reader struct {
	r *bufio.Reader
	// Limit caps the un-escaped body bytes delivered per frame; the rest is
	// read and discarded so the next frame still starts at the right byte.
	// A negative Limit means unlimited.
	Limit int64

	scratch []byte
}

// NewReader returns a Reader on r with the given per-frame body limit
// (negative = unlimited).
func NewReader(r *bufio.Reader, limit int64) *Reader {
	return &Reader{r: r, Limit: limit}
}

// Next reads one frame: body bytes up to the first raw Delim, then the
// exit text and '\n'. The un-escaped body is streamed to body as it
// arrives (nothing is buffered beyond one read), up to Limit bytes.
//
// The returned error reports stream problems only: io.ErrUnexpectedEOF if
// the stream ends before a complete trailer, an ErrMalformedTrailer wrap,
// or a read error. Any such error leaves the stream out of sync. Body
// writer failures are reported in Result.WriteErr instead, because the
// frame was still drained and the stream is still usable.
func (fr *Reader) Next(body io.Writer) (Result, error) {
	var (
		res Result
		u   Unescaper
	)
	// Deliver whatever has arrived as soon as it arrives: a command's
	// output streams, so a reader must not sit on it until the trailer.
	for {
		if fr.r.Buffered() == 0 {
			if _, err := fr.r.Peek(1); err != nil {
				if err == io.EOF {
					return res, io.ErrUnexpectedEOF
				}
				return res, fmt.Errorf("frame: reading body: %w", err)
			}
		}
		buf, _ := fr.r.Peek(fr.r.Buffered())
		i := bytes.IndexByte(buf, Delim)
		chunk := buf
		if i >= 0 {
			chunk = buf[:i]
		}
		if len(chunk) > 0 {
			fr.scratch = u.Append(fr.scratch[:0], chunk)
			fr.deliver(&res, body, fr.scratch)
		}
		if i >= 0 {
			fr.r.Discard(i + 1)
			break
		}
		fr.r.Discard(len(buf))
	}

	exit, err := readTrailer(fr.r)
	if err != nil {
		return res, err
	}
	res.Exit = exit
	return res, nil
}

func (fr *Reader) deliver(res *Result, body io.Writer, p []byte) {
	n := int64(len(p))
	if res.WriteErr != nil || body == nil {
		res.Discarded += n
		return
	}
	if fr.Limit >= 0 {
		room := fr.Limit - res.Written
		if room <= 0 {
			res.Discarded += n
			return
		}
		if n > room {
			res.Discarded += n - room
			p = p[:room]
		}
	}
	w, err := body.Write(p)
	res.Written += int64(w)
	if err == nil && w < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		res.WriteErr = err
		res.Discarded += int64(len(p) - w)
	}
}

// readTrailer reads "<optional '-'><digits>\n" after the Delim.
func readTrailer(r *bufio.Reader) (int, error) {
	var text [maxTrailerText]byte
	n := 0
	for {
		c, err := r.ReadByte()
		if err != nil {
			if err == io.EOF {
				return 0, io.ErrUnexpectedEOF
			}
			return 0, fmt.Errorf("frame: reading trailer: %w", err)
		}
		if c == '\n' {
			break
		}
		if n == len(text) {
			return 0, fmt.Errorf("%w: exit text longer than %d bytes", ErrMalformedTrailer, maxTrailerText)
		}
		isDigit := c >= '0' && c <= '9'
		if !isDigit && !(c == '-' && n == 0) {
			return 0, fmt.Errorf("%w: unexpected byte %q in exit text", ErrMalformedTrailer, c)
		}
		text[n] = c
		n++
	}
	if n == 0 || (n == 1 && text[0] == '-') {
		return 0, fmt.Errorf("%w: no exit digits", ErrMalformedTrailer)
	}
	// At most 12 bytes of sign+digits always fits in int64; int is 64-bit
	// on every platform nether supports.
	v, err := strconv.ParseInt(string(text[:n]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMalformedTrailer, err)
	}
	return int(v), nil
}

// ReadFrame reads one frame from r, streaming at most limit un-escaped body
// bytes to body (limit < 0 = unlimited) and discarding the rest while still
// reading to the trailer, so the next frame stays in sync. It returns the
// trailer's exit code. A body writer error is returned only after the frame
// has been fully drained.
func ReadFrame(r *bufio.Reader, body io.Writer, limit int64) (exit int, err error) {
	res, err := NewReader(r, limit).Next(body)
	if err != nil {
		return res.Exit, err
	}
	if res.WriteErr != nil {
		return res.Exit, fmt.Errorf("frame: writing body: %w", res.WriteErr)
	}
	return res.Exit, nil
}
