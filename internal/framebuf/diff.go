package framebuf

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strings"
)

// DefaultTile is the tile edge, in pixels, of a FRAMEDIFF when the caller
// does not choose one: 64x64x3 = 12 KiB a tile, small enough that a
// blinking cursor costs one tile, large enough that a full 720x400 text
// screen is 84 records.
const DefaultTile = 64

// MinTile and MaxTile bound the tile edge of a FRAMEDIFF. The lower
// bound keeps a decoded reply's bookkeeping small next to its pixels: with
// 1-pixel tiles a 64 MiB frame would decode into 22 million records.
const (
	MinTile = 8
	MaxTile = MaxWidth
)

// maxDiffLine bounds a FRAMEDIFF header or record line.
const maxDiffLine = 64

// View is what one client last saw of the frame, so the next Diff sends
// only what changed. The zero View has seen nothing.
type View struct {
	width, height int
	pix           []byte
}

// Diff returns the FRAMEDIFF reply that brings a client whose view is v
// to cur, and records cur in v. (A method, not a function: the decoded
// reply is the type Diff.) Every tile goes out on the first call and
// when the frame size changed; none when nothing changed. Tiles are
// listed in row-major order. tile <= 0 means DefaultTile; a tile outside
// MinTile..MaxTile is brought within. cur must be a
// well-formed frame (Check), as ParsePPM's are.
func (v *View) Diff(cur Image, tile int) []byte {
	if tile <= 0 {
		tile = DefaultTile
	}
	tile = min(max(tile, MinTile), MaxTile)
	full := v.pix == nil || v.width != cur.Width || v.height != cur.Height
	var changed [][4]int
	for y := 0; y < cur.Height; y += tile {
		th := min(tile, cur.Height-y)
		for x := 0; x < cur.Width; x += tile {
			tw := min(tile, cur.Width-x)
			if full || !tileEqual(cur, v.pix, x, y, tw, th) {
				changed = append(changed, [4]int{x, y, tw, th})
			}
		}
	}
	size := 48
	for _, t := range changed {
		size += 32 + t[2]*t[3]*3
	}
	out := make([]byte, 0, size)
	out = fmt.Appendf(out, "FRAMEDIFF %d %d %d %d\n", cur.Width, cur.Height, tile, len(changed))
	for _, t := range changed {
		out = fmt.Appendf(out, "%d %d %d %d\n", t[0], t[1], t[2], t[3])
		for row := t[1]; row < t[1]+t[3]; row++ {
			off := (row*cur.Width + t[0]) * 3
			out = append(out, cur.Pix[off:off+t[2]*3]...)
		}
	}
	// The view keeps its own copy: the caller may reuse cur's buffer.
	if full {
		v.width, v.height, v.pix = cur.Width, cur.Height, bytes.Clone(cur.Pix)
	} else {
		for _, t := range changed {
			copyTile(v.pix, cur.Pix, cur.Width, t)
		}
	}
	return out
}

func tileEqual(cur Image, prev []byte, x, y, w, h int) bool {
	for row := y; row < y+h; row++ {
		off := (row*cur.Width + x) * 3
		if !bytes.Equal(cur.Pix[off:off+w*3], prev[off:off+w*3]) {
			return false
		}
	}
	return true
}

// copyTile copies tile t (x, y, w, h) of a frame width pixels wide from
// src to dst.
func copyTile(dst, src []byte, width int, t [4]int) {
	for row := t[1]; row < t[1]+t[3]; row++ {
		off := (row*width + t[0]) * 3
		copy(dst[off:off+t[2]*3], src[off:off+t[2]*3])
	}
}

// Diff is a decoded FRAMEDIFF reply.
type Diff struct {
	Width, Height, Tile int
	Tiles               []Tile
}

// Tile is one changed rectangle: its pixels, RGB, row by row.
type Tile struct {
	X, Y, W, H int
	Pix        []byte
}

// ReadDiff reads exactly one FRAMEDIFF reply from r. Each tile must sit
// on the announced grid with its exact edge size, tiles must come in
// row-major order without repeats, and the frame must be within bounds;
// so a reply never carries more pixels than the frame has.
func ReadDiff(r *bufio.Reader) (Diff, error) {
	line, err := readLine(r)
	if err != nil {
		if err == io.EOF {
			return Diff{}, io.EOF
		}
		return Diff{}, fmt.Errorf("reading the FRAMEDIFF header: %w", err)
	}
	rest, ok := strings.CutPrefix(line, "FRAMEDIFF ")
	if !ok {
		return Diff{}, formatErr("FRAMEDIFF header %q", line)
	}
	f, err := fields(rest, 4)
	if err != nil {
		return Diff{}, formatErr("FRAMEDIFF header %q: %v", line, err)
	}
	d := Diff{Width: f[0], Height: f[1], Tile: f[2]}
	count := f[3]
	if err := checkSize(d.Width, d.Height); err != nil {
		return Diff{}, err
	}
	if d.Tile < MinTile || d.Tile > MaxTile {
		return Diff{}, formatErr("FRAMEDIFF tile %d outside %d..%d", d.Tile, MinTile, MaxTile)
	}
	cols, rows := ceilDiv(d.Width, d.Tile), ceilDiv(d.Height, d.Tile)
	if count > cols*rows {
		return Diff{}, formatErr("FRAMEDIFF announces %d tiles, a %dx%d frame has %d of %d pixels", count, d.Width, d.Height, cols*rows, d.Tile)
	}
	// No room is reserved from count: it is only a claim until the
	// tiles' bytes arrive.
	next := 0 // the lowest grid index the next tile may have
	for i := 0; i < count; i++ {
		line, err := readLine(r)
		if err != nil {
			return Diff{}, fmt.Errorf("reading FRAMEDIFF tile %d of %d: %w", i+1, count, eofUnexpected(err))
		}
		f, err := fields(line, 4)
		if err != nil {
			return Diff{}, formatErr("FRAMEDIFF tile %d of %d %q: %v", i+1, count, line, err)
		}
		t := Tile{X: f[0], Y: f[1], W: f[2], H: f[3]}
		if err := d.checkTile(t); err != nil {
			return Diff{}, fmt.Errorf("FRAMEDIFF tile %d of %d: %w", i+1, count, err)
		}
		idx := (t.Y/d.Tile)*cols + t.X/d.Tile
		if idx < next {
			return Diff{}, formatErr("FRAMEDIFF tile %d of %d at %d,%d is out of row-major order or repeated", i+1, count, t.X, t.Y)
		}
		next = idx + 1
		t.Pix = make([]byte, t.W*t.H*3)
		if _, err := io.ReadFull(r, t.Pix); err != nil {
			return Diff{}, formatErr("FRAMEDIFF tile %d of %d truncated: %v", i+1, count, eofUnexpected(err))
		}
		d.Tiles = append(d.Tiles, t)
	}
	return d, nil
}

// checkTile says whether t is a tile of d's grid with the right size.
func (d Diff) checkTile(t Tile) error {
	if t.X < 0 || t.Y < 0 || t.X >= d.Width || t.Y >= d.Height || t.X%d.Tile != 0 || t.Y%d.Tile != 0 {
		return formatErr("tile at %d,%d is not on the %d-pixel grid of a %dx%d frame", t.X, t.Y, d.Tile, d.Width, d.Height)
	}
	if w, h := min(d.Tile, d.Width-t.X), min(d.Tile, d.Height-t.Y); t.W != w || t.H != h {
		return formatErr("tile at %d,%d is %dx%d, want %dx%d", t.X, t.Y, t.W, t.H, w, h)
	}
	return nil
}

// Apply paints d onto dst. When the frame size changed, d must cover the
// whole frame (nether then sends every tile) and dst is resized.
func (d Diff) Apply(dst *Image) error {
	if err := checkSize(d.Width, d.Height); err != nil {
		return err
	}
	if d.Tile < MinTile || d.Tile > MaxTile {
		return formatErr("FRAMEDIFF tile %d outside %d..%d", d.Tile, MinTile, MaxTile)
	}
	cols, rows := ceilDiv(d.Width, d.Tile), ceilDiv(d.Height, d.Tile)
	resized := dst.Width != d.Width || dst.Height != d.Height || len(dst.Pix) != d.Width*d.Height*3
	if resized && len(d.Tiles) != cols*rows {
		return formatErr("a %dx%d FRAMEDIFF onto a %dx%d frame must carry all %d tiles, it has %d",
			d.Width, d.Height, dst.Width, dst.Height, cols*rows, len(d.Tiles))
	}
	next := 0
	for i, t := range d.Tiles {
		if err := d.checkTile(t); err != nil {
			return fmt.Errorf("tile %d: %w", i+1, err)
		}
		if len(t.Pix) != t.W*t.H*3 {
			return formatErr("tile %d at %d,%d has %d bytes of pixels, want %d", i+1, t.X, t.Y, len(t.Pix), t.W*t.H*3)
		}
		// Ascending and on the grid: with all cols*rows tiles present
		// this covers every pixel of a resized frame.
		idx := (t.Y/d.Tile)*cols + t.X/d.Tile
		if idx < next {
			return formatErr("tile %d at %d,%d is out of row-major order or repeated", i+1, t.X, t.Y)
		}
		next = idx + 1
	}
	pix := dst.Pix
	if resized {
		pix = make([]byte, d.Width*d.Height*3)
	}
	for _, t := range d.Tiles {
		for row := 0; row < t.H; row++ {
			off := ((t.Y+row)*d.Width + t.X) * 3
			copy(pix[off:off+t.W*3], t.Pix[row*t.W*3:(row+1)*t.W*3])
		}
	}
	dst.Width, dst.Height, dst.Pix = d.Width, d.Height, pix
	return nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// readLine reads one '\n'-terminated line of at most maxDiffLine bytes
// and returns it without the newline.
func readLine(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		c, err := r.ReadByte()
		if err != nil {
			if err == io.EOF && len(b) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return "", err
		}
		if c == '\n' {
			return string(b), nil
		}
		if len(b) >= maxDiffLine {
			return "", formatErr("line longer than %d bytes", maxDiffLine)
		}
		b = append(b, c)
	}
}

// fields splits s into exactly n canonical decimals separated by single
// spaces.
func fields(s string, n int) ([]int, error) {
	parts := strings.Split(s, " ")
	if len(parts) != n {
		return nil, fmt.Errorf("%d fields, want %d", len(parts), n)
	}
	out := make([]int, n)
	for i, p := range parts {
		v, ok := atoiStrict(p)
		if !ok {
			return nil, fmt.Errorf("%q is not a decimal number", p)
		}
		out[i] = v
	}
	return out, nil
}
