package screen

import (
	"strconv"

	uv "github.com/charmbracelet/ultraviolet"

	"github.com/nethersandbox/nether/internal/logtext"
)

// View is one client's record of the live grid as its last Diff returned
// it. The zero value has seen nothing, so its first Diff returns every
// row. A View belongs to one client and is not safe for concurrent use.
type View struct {
	cols, rows int
	lines      []string // escaped text of each row, as last returned
}

// Screen returns the __screen__ reply: a header line, then the scrollback
// (oldest first) and the rows of the live grid, one escaped line each.
//
//	SCREEN <count> <cols> <rows> <cursor_row> <cursor_col>\n
func (t *Terminal) Screen() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	sb := t.emu.Scrollback().Lines()
	if len(sb) > t.scrollback {
		sb = sb[len(sb)-t.scrollback:]
	}
	cols, rows := t.emu.Width(), t.emu.Height()
	out := t.header(nil, "SCREEN", len(sb)+rows)
	for _, line := range sb {
		out = append(appendRow(out, line), '\n')
	}
	line := make(uv.Line, cols)
	for y := range rows {
		out = append(appendRow(out, t.liveRow(y, line)), '\n')
	}
	return out
}

// Diff returns the __screendiff__ reply for the client that owns v: the
// rows of the live grid that changed since v last saw them (every row on
// the first call and after a resize), each as "<row> <text>", and records
// what it returned in v. A nil v gets every row.
//
//	SCREENDIFF <count> <cols> <rows> <cursor_row> <cursor_col>\n
func (t *Terminal) Diff(v *View) []byte {
	if v == nil {
		v = &View{}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cols, rows := t.emu.Width(), t.emu.Height()
	fresh := v.lines == nil || v.cols != cols || v.rows != rows
	if fresh {
		*v = View{cols: cols, rows: rows, lines: make([]string, rows)}
	}
	var body, text []byte
	count := 0
	line := make(uv.Line, cols)
	for y := range rows {
		text = appendRow(text[:0], t.liveRow(y, line))
		if !fresh && string(text) == v.lines[y] {
			continue
		}
		v.lines[y] = string(text)
		count++
		body = strconv.AppendInt(body, int64(y), 10)
		body = append(body, ' ')
		body = append(append(body, text...), '\n')
	}
	return append(t.header(make([]byte, 0, 64+len(body)), "SCREENDIFF", count), body...)
}

// header appends "<kind> <count> <cols> <rows> <cursor_row> <cursor_col>\n".
// The cursor is kept inside the grid: the emulator may report it one past
// the last column while a wrap is pending.
func (t *Terminal) header(dst []byte, kind string, count int) []byte {
	cols, rows := t.emu.Width(), t.emu.Height()
	cur := t.emu.CursorPosition()
	dst = append(dst, kind...)
	for _, n := range []int{count, cols, rows, min(max(cur.Y, 0), rows-1), min(max(cur.X, 0), cols-1)} {
		dst = strconv.AppendInt(append(dst, ' '), int64(n), 10)
	}
	return append(dst, '\n')
}

// liveRow copies row y of the live grid into line (len(line) == cols).
func (t *Terminal) liveRow(y int, line uv.Line) uv.Line {
	for x := range line {
		if c := t.emu.CellAt(x, y); c != nil {
			line[x] = *c
		} else {
			line[x] = uv.EmptyCell
		}
	}
	return line
}

// appendRow appends the text of a row of cells, escaped, with trailing
// blanks trimmed.
func appendRow(dst []byte, line uv.Line) []byte {
	end := len(dst) // just past the last non-blank cell
	for i := range line {
		c := &line[i]
		switch {
		case c.Content == "" && c.Width == 0:
			// The cells a wide character covers after its first.
			continue
		case c.Content == "" || c.Content == " ":
			dst = append(dst, ' ')
		default:
			dst = logtext.AppendEscaped(dst, c.Content)
			end = len(dst)
		}
	}
	return dst[:end]
}
