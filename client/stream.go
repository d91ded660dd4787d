package client

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Bounds on what a streamed reply may announce. The server is trusted to
// follow the protocol, but a buggy or hostile one must not be able to make
// the client read forever or allocate without limit: an announced size past
// a bound is an error before any of it is read.
const (
	// MaxStreamHeader bounds a streamed reply's header line, and each tile
	// record line of a FRAMEDIFF.
	MaxStreamHeader = 4 << 10
	// MaxStreamLine bounds one line of a text reply (an event, a command
	// log entry, a screen row), including its '\n'.
	MaxStreamLine = 1 << 20
	// MaxStreamLines bounds the line count a text reply's header announces.
	MaxStreamLines = 1 << 20
	// MaxStreamText bounds the whole of a text reply, header included.
	MaxStreamText = 64 << 20
	// MaxFramePixels bounds width*height of a __frame__ or __framediff__
	// (64 Mi pixels: 192 MiB of RGB).
	MaxFramePixels = 64 << 20
)

// ErrStreamFormat is wrapped by every error about a streamed reply that
// does not follow its wire format (see the package documentation). After
// it the connection is out of sync and the Client refuses further commands.
var ErrStreamFormat = errors.New("malformed streamed reply")

// Header words of the streamed replies: the first word of the first line.
const (
	headerEvents     = "EVENTS"
	headerCmdLog     = "CMDLOG"
	headerNetLog     = "NETLOG"
	headerScreen     = "SCREEN"
	headerScreenDiff = "SCREENDIFF"
	headerFrame      = "P6"
	headerFrameDiff  = "FRAMEDIFF"
)

// streamHeaders maps each streamed verb to the header word of its reply. A
// reply to a known verb with another header means the stream is out of
// sync; a streamed verb missing here (added to the protocol after this
// client) is read by whatever known header it answers with.
var streamHeaders = map[string]string{
	"__events__":     headerEvents,
	"__cmdlog__":     headerCmdLog,
	"__netlog__":     headerNetLog,
	"__screen__":     headerScreen,
	"__screendiff__": headerScreenDiff,
	"__frame__":      headerFrame,
	"__framediff__":  headerFrameDiff,
}

// payloadReader consumes one streamed payload from r, copying every byte
// it consumes, unchanged, to out. A failing out does not stop the reading:
// the payload is still consumed to its end so the next reply stays in
// sync, and the write error is kept for the caller.
type payloadReader struct {
	r        *bufio.Reader
	out      io.Writer
	consumed int64
	writeErr error
}

func (p *payloadReader) emit(b []byte) {
	p.consumed += int64(len(b))
	if p.writeErr != nil || p.out == nil {
		return
	}
	n, err := p.out.Write(b)
	if err == nil && n < len(b) {
		err = io.ErrShortWrite
	}
	p.writeErr = err
}

// line consumes one '\n'-terminated line of at most max bytes (the '\n'
// included) and returns it without the '\n' when keep is set. Lines longer
// than the reader's buffer are copied through in pieces, so max may exceed
// the buffer size; only a kept line is held in memory.
func (p *payloadReader) line(max int, keep bool, what string) ([]byte, error) {
	var kept []byte
	n := 0
	for {
		chunk, err := p.r.ReadSlice('\n')
		n += len(chunk)
		if n > max {
			// Leave the stream where it is: it is out of sync anyway.
			return nil, fmt.Errorf("%w: %s longer than %d bytes", ErrStreamFormat, what, max)
		}
		p.emit(chunk)
		if keep {
			kept = append(kept, chunk...)
		}
		switch {
		case err == nil:
			if keep {
				return kept[:len(kept)-1], nil
			}
			return nil, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			return nil, fmt.Errorf("reading %s: %w", what, io.ErrUnexpectedEOF)
		default:
			return nil, fmt.Errorf("reading %s: %w", what, err)
		}
	}
}

// bytes consumes exactly n bytes.
func (p *payloadReader) bytes(n int64, what string) error {
	for n > 0 {
		if _, err := p.r.Peek(1); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("reading %s (%d bytes short): %w", what, n, err)
		}
		buf, _ := p.r.Peek(int(min(int64(p.r.Buffered()), n)))
		p.emit(buf)
		p.r.Discard(len(buf))
		n -= int64(len(buf))
	}
	return nil
}

// readPayload reads one streamed payload by its header, byte-exact. want
// is the header word the command expects, or "" when any known one will
// do. The returned payloadReader tells how much was consumed and whether
// out failed.
func readPayload(r *bufio.Reader, out io.Writer, want string) (*payloadReader, error) {
	p := &payloadReader{r: r, out: out}
	first, err := p.line(MaxStreamHeader, true, "reply header")
	if err != nil {
		return p, err
	}
	word, _, _ := strings.Cut(string(first), " ")
	if want != "" && word != want {
		return p, fmt.Errorf("%w: expected a reply with header %s, got %s (out of sync?)", ErrStreamFormat, want, quoteHeader(first))
	}
	switch word {
	case headerEvents, headerCmdLog, headerNetLog:
		h, err := parseLogHeader(first)
		if err != nil {
			return p, err
		}
		return p, p.textLines(h.count)
	case headerScreen, headerScreenDiff:
		h, err := parseScreenHeader(first)
		if err != nil {
			return p, err
		}
		return p, p.textLines(h.count)
	case headerFrame:
		w, h, err := readPPMHeader(p, first)
		if err != nil {
			return p, err
		}
		return p, p.bytes(int64(w)*int64(h)*3, "frame pixels")
	case headerFrameDiff:
		return p, readFrameDiffBody(p, first)
	}
	return p, fmt.Errorf("%w: unknown reply header %s (a newer server?); the connection is out of sync", ErrStreamFormat, quoteHeader(first))
}

// textLines consumes count lines of a text reply, holding none of them.
func (p *payloadReader) textLines(count uint64) error {
	for i := uint64(0); i < count; i++ {
		if _, err := p.line(MaxStreamLine, false, "reply line"); err != nil {
			return fmt.Errorf("line %d of %d: %w", i+1, count, err)
		}
		if p.consumed > MaxStreamText {
			return fmt.Errorf("%w: text reply longer than %d bytes", ErrStreamFormat, MaxStreamText)
		}
	}
	return nil
}

func quoteHeader(b []byte) string {
	if len(b) > 80 {
		return strconv.Quote(string(b[:80])) + "..."
	}
	return strconv.Quote(string(b))
}

// fields splits a header on single spaces, refusing empty fields so that a
// stray space or '\r' is reported rather than guessed at.
func fields(line []byte) ([]string, error) {
	f := strings.Split(string(line), " ")
	for _, s := range f {
		if s == "" {
			return nil, fmt.Errorf("%w: header %s has an empty field", ErrStreamFormat, quoteHeader(line))
		}
	}
	return f, nil
}

func parseCount(s, what string, max uint64) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s %q is not a non-negative integer", ErrStreamFormat, what, s)
	}
	if n > max {
		return 0, fmt.Errorf("%w: %s %d exceeds the client's limit of %d", ErrStreamFormat, what, n, max)
	}
	return n, nil
}

// logHeader is "EVENTS <cursor> <count>[ dropped=<n>]",
// "CMDLOG <count>[ dropped=<n>]" or "NETLOG <count>[ dropped=<n>]".
type logHeader struct {
	word    string
	cursor  uint64 // EVENTS only
	count   uint64
	dropped uint64
}

func parseLogHeader(line []byte) (logHeader, error) {
	f, err := fields(line)
	if err != nil {
		return logHeader{}, err
	}
	h := logHeader{word: f[0]}
	rest := f[1:]
	if h.word == headerEvents {
		if len(rest) == 0 {
			return h, fmt.Errorf("%w: header %s has no cursor", ErrStreamFormat, quoteHeader(line))
		}
		if h.cursor, err = parseCount(rest[0], "event cursor", ^uint64(0)); err != nil {
			return h, err
		}
		rest = rest[1:]
	}
	if len(rest) == 0 {
		return h, fmt.Errorf("%w: header %s has no line count", ErrStreamFormat, quoteHeader(line))
	}
	if h.count, err = parseCount(rest[0], "line count", MaxStreamLines); err != nil {
		return h, err
	}
	for _, opt := range rest[1:] {
		v, ok := strings.CutPrefix(opt, "dropped=")
		if !ok {
			return h, fmt.Errorf("%w: header %s has an unknown field %q", ErrStreamFormat, quoteHeader(line), opt)
		}
		if h.dropped, err = parseCount(v, "dropped count", ^uint64(0)); err != nil {
			return h, err
		}
	}
	return h, nil
}

// screenHeader is "SCREEN|SCREENDIFF <count> <cols> <rows> <cursor_row> <cursor_col>".
type screenHeader struct {
	word                             string
	count                            uint64
	cols, rows, cursorRow, cursorCol int
}

// maxScreenDim bounds a terminal's size and cursor position, so they fit
// an int everywhere.
const maxScreenDim = 1 << 20

func parseScreenHeader(line []byte) (screenHeader, error) {
	f, err := fields(line)
	if err != nil {
		return screenHeader{}, err
	}
	h := screenHeader{word: f[0]}
	if len(f) != 6 {
		return h, fmt.Errorf("%w: header %s wants 5 numbers", ErrStreamFormat, quoteHeader(line))
	}
	if h.count, err = parseCount(f[1], "line count", MaxStreamLines); err != nil {
		return h, err
	}
	for i, dst := range []*int{&h.cols, &h.rows, &h.cursorRow, &h.cursorCol} {
		n, err := parseCount(f[2+i], []string{"cols", "rows", "cursor row", "cursor column"}[i], maxScreenDim)
		if err != nil {
			return h, err
		}
		*dst = int(n)
	}
	return h, nil
}

// readPPMHeader reads the rest of "P6\n<width> <height>\n255\n" after its
// first line, in exactly that form (no comments, single separators).
func readPPMHeader(p *payloadReader, first []byte) (width, height int, err error) {
	if string(first) != headerFrame {
		return 0, 0, fmt.Errorf("%w: PPM magic line %s is not \"P6\"", ErrStreamFormat, quoteHeader(first))
	}
	dims, err := p.line(64, true, "PPM size line")
	if err != nil {
		return 0, 0, err
	}
	ws, hs, ok := strings.Cut(string(dims), " ")
	if !ok {
		return 0, 0, fmt.Errorf("%w: PPM size line %s is not \"<width> <height>\"", ErrStreamFormat, quoteHeader(dims))
	}
	width, height, err = frameSize(ws, hs)
	if err != nil {
		return 0, 0, err
	}
	maxval, err := p.line(64, true, "PPM maxval line")
	if err != nil {
		return 0, 0, err
	}
	if string(maxval) != "255" {
		return 0, 0, fmt.Errorf("%w: PPM maxval %s is not 255", ErrStreamFormat, quoteHeader(maxval))
	}
	return width, height, nil
}

// frameSize parses a frame's width and height and checks them against
// MaxFramePixels.
func frameSize(ws, hs string) (width, height int, err error) {
	w, err := parseCount(ws, "frame width", MaxFramePixels)
	if err != nil {
		return 0, 0, err
	}
	h, err := parseCount(hs, "frame height", MaxFramePixels)
	if err != nil {
		return 0, 0, err
	}
	if w*h > MaxFramePixels { // both ≤ 2^26, so the product cannot overflow
		return 0, 0, fmt.Errorf("%w: frame %dx%d exceeds the client's limit of %d pixels", ErrStreamFormat, w, h, MaxFramePixels)
	}
	return int(w), int(h), nil
}

// frameDiffHeader is "FRAMEDIFF <width> <height> <tile> <count>".
type frameDiffHeader struct {
	width, height, tile int
	count               uint64
}

func parseFrameDiffHeader(line []byte) (frameDiffHeader, error) {
	f, err := fields(line)
	if err != nil {
		return frameDiffHeader{}, err
	}
	if len(f) != 5 || f[0] != headerFrameDiff {
		return frameDiffHeader{}, fmt.Errorf("%w: header %s is not \"FRAMEDIFF <width> <height> <tile> <count>\"", ErrStreamFormat, quoteHeader(line))
	}
	var h frameDiffHeader
	if h.width, h.height, err = frameSize(f[1], f[2]); err != nil {
		return h, err
	}
	tile, err := parseCount(f[3], "tile size", MaxFramePixels)
	if err != nil {
		return h, err
	}
	if tile == 0 {
		return h, fmt.Errorf("%w: tile size 0", ErrStreamFormat)
	}
	h.tile = int(tile)
	// Tiles cover the frame on a grid without overlap, so there are at
	// most this many; the bound also keeps a hostile count from looping.
	across := (uint64(h.width) + tile - 1) / tile
	down := (uint64(h.height) + tile - 1) / tile
	if h.count, err = parseCount(f[4], "tile count", across*down); err != nil {
		return h, err
	}
	return h, nil
}

// tileRecord is one "<x> <y> <w> <h>" line of a FRAMEDIFF.
type tileRecord struct{ x, y, w, h int }

// parseTileRecord checks that the tile lies inside the frame and is no
// larger than the tile size, which bounds the pixels that follow it.
func parseTileRecord(line []byte, d frameDiffHeader) (tileRecord, error) {
	f, err := fields(line)
	if err != nil {
		return tileRecord{}, err
	}
	if len(f) != 4 {
		return tileRecord{}, fmt.Errorf("%w: tile record %s is not \"<x> <y> <w> <h>\"", ErrStreamFormat, quoteHeader(line))
	}
	var v [4]int
	for i, s := range f {
		n, err := parseCount(s, "tile coordinate", MaxFramePixels)
		if err != nil {
			return tileRecord{}, err
		}
		v[i] = int(n)
	}
	t := tileRecord{x: v[0], y: v[1], w: v[2], h: v[3]}
	if t.w == 0 || t.h == 0 || t.w > d.tile || t.h > d.tile || t.x+t.w > d.width || t.y+t.h > d.height {
		return t, fmt.Errorf("%w: tile %dx%d at (%d,%d) does not fit a %dx%d frame with %d-pixel tiles", ErrStreamFormat, t.w, t.h, t.x, t.y, d.width, d.height, d.tile)
	}
	return t, nil
}

// readFrameDiffBody consumes the tile records of a FRAMEDIFF whose header
// line is first.
func readFrameDiffBody(p *payloadReader, first []byte) error {
	d, err := parseFrameDiffHeader(first)
	if err != nil {
		return err
	}
	// Tiles do not overlap, so together they hold at most the frame's
	// pixels; a server repeating tiles cannot make us read more.
	budget := int64(d.width) * int64(d.height)
	for i := uint64(0); i < d.count; i++ {
		rec, err := p.line(MaxStreamHeader, true, "tile record")
		if err != nil {
			return fmt.Errorf("tile %d of %d: %w", i+1, d.count, err)
		}
		t, err := parseTileRecord(rec, d)
		if err != nil {
			return fmt.Errorf("tile %d of %d: %w", i+1, d.count, err)
		}
		budget -= int64(t.w) * int64(t.h)
		if budget < 0 {
			return fmt.Errorf("%w: tiles hold more pixels than the %dx%d frame", ErrStreamFormat, d.width, d.height)
		}
		if err := p.bytes(int64(t.w)*int64(t.h)*3, "tile pixels"); err != nil {
			return fmt.Errorf("tile %d of %d: %w", i+1, d.count, err)
		}
	}
	return nil
}

// splitLines splits a text payload already framed by readPayload into its
// header and body lines (without their '\n').
func splitLines(payload []byte) (header []byte, lines [][]byte) {
	payload = bytes.TrimSuffix(payload, []byte("\n"))
	all := bytes.Split(payload, []byte("\n"))
	return all[0], all[1:]
}
