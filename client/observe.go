package client

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"strconv"
	"strings"
)

// Events is a __events__ reply: a slice of the sandbox's event timeline.
type Events struct {
	// Cursor is the seq of the newest event in the timeline (0 if there is
	// none). Pass it as since to the next Events call to get only later
	// events. A Cursor smaller than the since that was passed means the
	// timeline restarted (the cursor came from another timeline, e.g. a
	// fork's parent): Lines then holds the whole ring.
	Cursor uint64
	// Dropped counts events after since that had already left the ring.
	Dropped uint64
	// Lines are the events, oldest first.
	Lines []Event
}

// Event is one line of the timeline.
type Event struct {
	Seq uint64
	// MS is the server's millisecond timestamp of the event.
	MS int64
	// Kind is CMD, NET or LIFE (a newer server may add kinds).
	Kind string
	// Text is the event's text with the server's escapes decoded.
	Text string
}

// CmdLog is a __cmdlog__ reply: the per-command audit log.
type CmdLog struct {
	// Dropped counts entries that had already left the log.
	Dropped uint64
	// Entries are oldest first.
	Entries []CmdLogEntry
}

// CmdLogEntry is one command of the audit log.
type CmdLogEntry struct {
	MS      int64
	Exit    int
	CPUMS   int64
	Command string
}

// NetLog is a __netlog__ reply: the egress audit log.
type NetLog struct {
	Dropped uint64
	Entries []NetLogEntry
}

// NetLogEntry is one egress attempt.
type NetLogEntry struct {
	MS int64
	// Proto is TCP or UDP.
	Proto string
	// Addr is the destination as "<ip>:<port>".
	Addr    string
	Allowed bool
}

// Screen is a __screen__ reply: the terminal's scrollback and live grid.
type Screen struct {
	Cols, Rows int
	// CursorRow and CursorCol are 0-based within the live grid.
	CursorRow, CursorCol int
	// Lines are the scrollback, oldest first, then the live grid; each is
	// a row's text with trailing blanks trimmed and escapes decoded.
	Lines []string
}

// Grid returns the live grid: the last Rows lines.
func (s Screen) Grid() []string {
	return s.Lines[len(s.Lines)-min(s.Rows, len(s.Lines)):]
}

// ScreenDiff is a __screendiff__ reply: the rows of the live grid that
// changed since this client's previous ScreenDiff (all rows on the first
// call and after a resize).
type ScreenDiff struct {
	Cols, Rows           int
	CursorRow, CursorCol int
	// Changed is in ascending row order; empty when nothing changed.
	Changed []ScreenRow
}

// ScreenRow is one changed row of the live grid.
type ScreenRow struct {
	// Row is 0-based in the live grid.
	Row  int
	Text string
}

// Frame is a __frame__ reply: the framebuffer.
type Frame struct {
	Width, Height int
	// RGB holds Width*Height pixels of 3 bytes, row by row.
	RGB []byte
}

// Image returns the frame as an image (a copy, with opaque alpha).
func (f Frame) Image() *image.RGBA {
	img := image.NewRGBA(image.Rect(0, 0, f.Width, f.Height))
	for i, j := 0, 0; i+2 < len(f.RGB) && j+3 < len(img.Pix); i, j = i+3, j+4 {
		img.Pix[j], img.Pix[j+1], img.Pix[j+2], img.Pix[j+3] = f.RGB[i], f.RGB[i+1], f.RGB[i+2], 0xff
	}
	return img
}

// FrameDiff is a __framediff__ reply: the tiles of the framebuffer that
// changed since this client's previous FrameDiff (all tiles on the first
// call and whenever the frame size changed).
type FrameDiff struct {
	Width, Height int
	// Tile is the grid's tile size; edge tiles may be smaller.
	Tile  int
	Tiles []Tile
}

// Tile is one changed tile.
type Tile struct {
	X, Y, W, H int
	// RGB holds W*H pixels of 3 bytes, row by row.
	RGB []byte
}

// Apply paints d onto f. A frame of another size is replaced by a black
// one of d's size first: the server sends every tile after a size change,
// so the result is whole.
func (d FrameDiff) Apply(f *Frame) {
	if f.Width != d.Width || f.Height != d.Height || len(f.RGB) != d.Width*d.Height*3 {
		*f = Frame{Width: d.Width, Height: d.Height, RGB: make([]byte, d.Width*d.Height*3)}
	}
	for _, t := range d.Tiles {
		if t.X < 0 || t.Y < 0 || t.X+t.W > f.Width || t.Y+t.H > f.Height || len(t.RGB) != t.W*t.H*3 {
			continue // only a hand-built diff can be off the frame
		}
		for row := range t.H {
			dst := ((t.Y+row)*f.Width + t.X) * 3
			copy(f.RGB[dst:dst+t.W*3], t.RGB[row*t.W*3:])
		}
	}
}

// stream runs a streamed command and returns its raw payload. The payload
// is held in memory, bounded by the Max* limits of the reply's shape.
func (c *Client) stream(ctx context.Context, line string) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := c.Run(ctx, line, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Events returns the events after seq since. Seqs start at 1, so since 0
// asks for the whole ring; it is sent as a bare __events__, which the
// server reads as 0, and Dropped then counts the events the ring has lost
// since the sandbox started.
func (c *Client) Events(ctx context.Context, since uint64) (Events, error) {
	line := "__events__"
	if since > 0 {
		line += " " + strconv.FormatUint(since, 10)
	}
	payload, err := c.stream(ctx, line)
	if err != nil {
		return Events{}, err
	}
	return parseEvents(payload)
}

// CmdLog returns the per-command audit log.
func (c *Client) CmdLog(ctx context.Context) (CmdLog, error) {
	payload, err := c.stream(ctx, "__cmdlog__")
	if err != nil {
		return CmdLog{}, err
	}
	return parseCmdLog(payload)
}

// NetLog returns the egress audit log (net=1).
func (c *Client) NetLog(ctx context.Context) (NetLog, error) {
	payload, err := c.stream(ctx, "__netlog__")
	if err != nil {
		return NetLog{}, err
	}
	return parseNetLog(payload)
}

// Screen returns the terminal's scrollback and live grid.
func (c *Client) Screen(ctx context.Context) (Screen, error) {
	payload, err := c.stream(ctx, "__screen__")
	if err != nil {
		return Screen{}, err
	}
	return parseScreen(payload)
}

// ScreenDiff returns the rows changed since this client's previous call.
// Only the primary client may ask.
func (c *Client) ScreenDiff(ctx context.Context) (ScreenDiff, error) {
	payload, err := c.stream(ctx, "__screendiff__")
	if err != nil {
		return ScreenDiff{}, err
	}
	return parseScreenDiff(payload)
}

// Frame returns the framebuffer (gpu=1; otherwise a *ControlError).
func (c *Client) Frame(ctx context.Context) (Frame, error) {
	payload, err := c.stream(ctx, "__frame__")
	if err != nil {
		return Frame{}, err
	}
	return parseFrame(payload)
}

// FrameDiff returns the tiles changed since this client's previous call
// (gpu=1). Only the primary client may ask.
func (c *Client) FrameDiff(ctx context.Context) (FrameDiff, error) {
	payload, err := c.stream(ctx, "__framediff__")
	if err != nil {
		return FrameDiff{}, err
	}
	return parseFrameDiff(payload)
}

// The parsers below decode a payload that readPayload has already framed;
// they are also safe on arbitrary bytes (see the fuzz tests), since a
// payload is only as trustworthy as the server.

func parseEvents(payload []byte) (Events, error) {
	header, lines := splitLines(payload)
	h, err := parseLogHeader(header)
	if err != nil {
		return Events{}, err
	}
	if h.word != headerEvents {
		return Events{}, fmt.Errorf("%w: expected an EVENTS header, got %s", ErrStreamFormat, quoteHeader(header))
	}
	if err := checkCount(h.count, lines); err != nil {
		return Events{}, err
	}
	ev := Events{Cursor: h.cursor, Dropped: h.dropped, Lines: make([]Event, 0, len(lines))}
	for i, line := range lines {
		f := strings.SplitN(string(line), " ", 4)
		if len(f) < 3 {
			return Events{}, lineError("event", i, line)
		}
		seq, err1 := strconv.ParseUint(f[0], 10, 64)
		ms, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil || f[2] == "" {
			return Events{}, lineError("event", i, line)
		}
		e := Event{Seq: seq, MS: ms, Kind: f[2]}
		if len(f) == 4 {
			e.Text = unescapeText(f[3])
		}
		ev.Lines = append(ev.Lines, e)
	}
	return ev, nil
}

func parseCmdLog(payload []byte) (CmdLog, error) {
	header, lines := splitLines(payload)
	h, err := parseLogHeader(header)
	if err != nil {
		return CmdLog{}, err
	}
	if h.word != headerCmdLog {
		return CmdLog{}, fmt.Errorf("%w: expected a CMDLOG header, got %s", ErrStreamFormat, quoteHeader(header))
	}
	if err := checkCount(h.count, lines); err != nil {
		return CmdLog{}, err
	}
	log := CmdLog{Dropped: h.dropped, Entries: make([]CmdLogEntry, 0, len(lines))}
	for i, line := range lines {
		f := strings.SplitN(string(line), " ", 4)
		if len(f) < 3 {
			return CmdLog{}, lineError("command log entry", i, line)
		}
		exitText, ok1 := strings.CutPrefix(f[1], "exit=")
		cpuText, ok2 := strings.CutPrefix(f[2], "cpu_ms=")
		ms, err1 := strconv.ParseInt(f[0], 10, 64)
		exit, err2 := strconv.ParseInt(exitText, 10, 32)
		cpu, err3 := strconv.ParseInt(cpuText, 10, 64)
		if !ok1 || !ok2 || err1 != nil || err2 != nil || err3 != nil {
			return CmdLog{}, lineError("command log entry", i, line)
		}
		e := CmdLogEntry{MS: ms, Exit: int(exit), CPUMS: cpu}
		if len(f) == 4 {
			e.Command = unescapeText(f[3])
		}
		log.Entries = append(log.Entries, e)
	}
	return log, nil
}

func parseNetLog(payload []byte) (NetLog, error) {
	header, lines := splitLines(payload)
	h, err := parseLogHeader(header)
	if err != nil {
		return NetLog{}, err
	}
	if h.word != headerNetLog {
		return NetLog{}, fmt.Errorf("%w: expected a NETLOG header, got %s", ErrStreamFormat, quoteHeader(header))
	}
	if err := checkCount(h.count, lines); err != nil {
		return NetLog{}, err
	}
	log := NetLog{Dropped: h.dropped, Entries: make([]NetLogEntry, 0, len(lines))}
	for i, line := range lines {
		f := strings.Split(string(line), " ")
		if len(f) != 4 || f[2] == "" || (f[3] != "ALLOW" && f[3] != "BLOCK") {
			return NetLog{}, lineError("egress log entry", i, line)
		}
		ms, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || (f[1] != "TCP" && f[1] != "UDP") {
			return NetLog{}, lineError("egress log entry", i, line)
		}
		log.Entries = append(log.Entries, NetLogEntry{MS: ms, Proto: f[1], Addr: f[2], Allowed: f[3] == "ALLOW"})
	}
	return log, nil
}

func parseScreen(payload []byte) (Screen, error) {
	header, lines := splitLines(payload)
	h, err := parseScreenHeader(header)
	if err != nil {
		return Screen{}, err
	}
	if h.word != headerScreen {
		return Screen{}, fmt.Errorf("%w: expected a SCREEN header, got %s", ErrStreamFormat, quoteHeader(header))
	}
	if err := checkCount(h.count, lines); err != nil {
		return Screen{}, err
	}
	s := Screen{Cols: h.cols, Rows: h.rows, CursorRow: h.cursorRow, CursorCol: h.cursorCol, Lines: make([]string, len(lines))}
	for i, line := range lines {
		s.Lines[i] = unescapeText(string(line))
	}
	return s, nil
}

func parseScreenDiff(payload []byte) (ScreenDiff, error) {
	header, lines := splitLines(payload)
	h, err := parseScreenHeader(header)
	if err != nil {
		return ScreenDiff{}, err
	}
	if h.word != headerScreenDiff {
		return ScreenDiff{}, fmt.Errorf("%w: expected a SCREENDIFF header, got %s", ErrStreamFormat, quoteHeader(header))
	}
	if err := checkCount(h.count, lines); err != nil {
		return ScreenDiff{}, err
	}
	d := ScreenDiff{Cols: h.cols, Rows: h.rows, CursorRow: h.cursorRow, CursorCol: h.cursorCol, Changed: make([]ScreenRow, 0, len(lines))}
	for i, line := range lines {
		rowText, text, _ := strings.Cut(string(line), " ")
		row, err := strconv.ParseUint(rowText, 10, 32)
		if err != nil || int(row) >= h.rows {
			return ScreenDiff{}, lineError("screen row", i, line)
		}
		d.Changed = append(d.Changed, ScreenRow{Row: int(row), Text: unescapeText(text)})
	}
	return d, nil
}

// cutLine splits b at its first '\n'; ok is false when there is none or
// the line is longer than max.
func cutLine(b []byte, max int) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(b[:min(len(b), max)], '\n')
	if i < 0 {
		return nil, b, false
	}
	return b[:i], b[i+1:], true
}

func parseFrame(payload []byte) (Frame, error) {
	magic, rest, ok1 := cutLine(payload, 3)
	dims, rest, ok2 := cutLine(rest, 64)
	maxval, pix, ok3 := cutLine(rest, 64)
	if !ok1 || !ok2 || !ok3 || string(magic) != headerFrame || string(maxval) != "255" {
		return Frame{}, fmt.Errorf("%w: not a \"P6\\n<width> <height>\\n255\\n\" PPM header", ErrStreamFormat)
	}
	ws, hs, _ := strings.Cut(string(dims), " ")
	w, h, err := frameSize(ws, hs)
	if err != nil {
		return Frame{}, err
	}
	if len(pix) != w*h*3 {
		return Frame{}, fmt.Errorf("%w: %dx%d frame with %d bytes of pixels, want %d", ErrStreamFormat, w, h, len(pix), w*h*3)
	}
	return Frame{Width: w, Height: h, RGB: pix}, nil
}

func parseFrameDiff(payload []byte) (FrameDiff, error) {
	header, rest, ok := cutLine(payload, MaxStreamHeader)
	if !ok {
		return FrameDiff{}, fmt.Errorf("%w: no FRAMEDIFF header line", ErrStreamFormat)
	}
	h, err := parseFrameDiffHeader(header)
	if err != nil {
		return FrameDiff{}, err
	}
	// The count is bounded by the tile grid, but only the bytes present
	// say how many tiles there really are: size the slice by those.
	d := FrameDiff{Width: h.width, Height: h.height, Tile: h.tile, Tiles: make([]Tile, 0, min(h.count, uint64(len(rest)/4)))}
	for i := uint64(0); i < h.count; i++ {
		rec, after, ok := cutLine(rest, MaxStreamHeader)
		if !ok {
			return FrameDiff{}, fmt.Errorf("%w: tile %d of %d: no record line", ErrStreamFormat, i+1, h.count)
		}
		t, err := parseTileRecord(rec, h)
		if err != nil {
			return FrameDiff{}, fmt.Errorf("tile %d of %d: %w", i+1, h.count, err)
		}
		n := t.w * t.h * 3
		if len(after) < n {
			return FrameDiff{}, fmt.Errorf("%w: tile %d of %d: %d bytes of pixels, want %d", ErrStreamFormat, i+1, h.count, len(after), n)
		}
		d.Tiles = append(d.Tiles, Tile{X: t.x, Y: t.y, W: t.w, H: t.h, RGB: after[:n:n]})
		rest = after[n:]
	}
	if len(rest) != 0 {
		return FrameDiff{}, fmt.Errorf("%w: %d bytes after the last tile", ErrStreamFormat, len(rest))
	}
	return d, nil
}

func checkCount(count uint64, lines [][]byte) error {
	if uint64(len(lines)) != count {
		return fmt.Errorf("%w: header announces %d lines, reply has %d", ErrStreamFormat, count, len(lines))
	}
	return nil
}

func lineError(what string, i int, line []byte) error {
	return fmt.Errorf("%w: %s %d: %s", ErrStreamFormat, what, i+1, quoteHeader(line))
}

// unescapeText decodes the server's text escapes: \xNN for a byte and \\
// for a backslash. Any other backslash is kept as it is: decoding is a
// convenience, and a lenient decoder loses nothing of a reply already
// framed.
func unescapeText(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case s[i+1] == '\\':
			b.WriteByte('\\')
			i++
		case s[i+1] == 'x' && i+3 < len(s) && isHex(s[i+2]) && isHex(s[i+3]):
			v, _ := strconv.ParseUint(s[i+2:i+4], 16, 8)
			b.WriteByte(byte(v))
			i += 3
		default:
			b.WriteByte('\\')
		}
	}
	return b.String()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
