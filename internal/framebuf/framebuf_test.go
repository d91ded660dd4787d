package framebuf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"image/png"
	"io"
	"strings"
	"testing"
)

// testImage is a w x h frame whose pixels depend on seed and position.
func testImage(w, h int, seed byte) Image {
	pix := make([]byte, w*h*3)
	for i := range pix {
		pix[i] = byte(i*7) ^ seed
	}
	return Image{Width: w, Height: h, Pix: pix}
}

func TestParsePPM(t *testing.T) {
	px := strings.Repeat("\x01\x02\x03", 6) // 3x2
	tests := []struct {
		name string
		in   string
		want string // error substring; "" for success
	}{
		{"canonical", "P6\n3 2\n255\n" + px, ""},
		{"whitespace runs and comments", "P6 # made by hand\r\n\t3 \n# a comment\n  2\n255 " + px, ""},
		{"comment right after magic", "P6#c\n3 2 255\n" + px, ""},
		{"qemu header", "P6\n3 2\n255\n" + px, ""},
		{"empty", "", "EOF"},
		{"P3 text ppm", "P3\n3 2\n255\n", "not a binary PPM"},
		{"maxval 65535", "P6\n3 2\n65535\n" + px + px, "maxval 65535"},
		{"maxval 15", "P6\n3 2\n15\n" + px, "maxval 15"},
		{"zero width", "P6\n0 2\n255\n", "outside"},
		{"too wide", "P6\n8193 1\n255\n", "outside"},
		{"too many pixels", "P6\n8192 8192\n255\n", "bytes of pixels"},
		{"ten digits", "P6\n1234567890 1\n255\n", "more than 9 digits"},
		{"sign", "P6\n+3 2\n255\n" + px, "not a digit"},
		{"no space after magic", "P63 2\n255\n" + px, "no whitespace"},
		{"junk after number", "P6\n3x 2\n255\n" + px, "after the number"},
		{"truncated header", "P6\n3 2\n25", "unexpected EOF"},
		{"header without its last whitespace", "P6\n3 2\n255", "unexpected EOF"},
		{"truncated pixels", "P6\n3 2\n255\n" + px[:17], "truncated"},
		{"no pixels", "P6\n3 2\n255\n", "truncated"},
		{"trailing data", "P6\n3 2\n255\n" + px + "\n", "trailing data"},
		{"endless comment", "P6\n#" + strings.Repeat("x", 5000), "header longer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			img, err := ParsePPM([]byte(tc.in))
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("err = %v, want one containing %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if img.Width != 3 || img.Height != 2 || string(img.Pix) != px {
				t.Fatalf("got %dx%d %q", img.Width, img.Height, img.Pix)
			}
			if got := string(img.PPM()); got != "P6\n3 2\n255\n"+px {
				t.Fatalf("PPM() = %q", got)
			}
		})
	}
}

// TestErrFormat: malformed input is recognisable as such.
func TestErrFormat(t *testing.T) {
	_, err := ParsePPM([]byte("P6\n3 2\n7\n"))
	if !errors.Is(err, ErrFormat) {
		t.Fatalf("err = %v, want ErrFormat", err)
	}
}

// TestReadPPMStream: images back to back on one stream are read one at a
// time, each leaving the reader at the next.
func TestReadPPMStream(t *testing.T) {
	a, b := testImage(5, 3, 1), testImage(2, 7, 2)
	r := bufio.NewReader(bytes.NewReader(append(append(a.PPM(), b.PPM()...), "rest"...)))
	for i, want := range []Image{a, b} {
		got, err := ReadPPM(r)
		if err != nil {
			t.Fatalf("image %d: %v", i, err)
		}
		if got.Width != want.Width || got.Height != want.Height || !bytes.Equal(got.Pix, want.Pix) {
			t.Fatalf("image %d differs", i)
		}
	}
	if rest, _ := io.ReadAll(r); string(rest) != "rest" {
		t.Fatalf("left %q", rest)
	}
	if _, err := ReadPPM(bufio.NewReader(strings.NewReader(""))); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
}

// roundTrip decodes a Diff reply and applies it onto prev.
func roundTrip(t *testing.T, reply []byte, prev *Image) Diff {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(reply))
	d, err := ReadDiff(r)
	if err != nil {
		t.Fatalf("ReadDiff: %v\n%q", err, reply[:min(len(reply), 200)])
	}
	if r.Buffered() != 0 {
		t.Fatalf("%d bytes left after the reply", r.Buffered())
	}
	if err := d.Apply(prev); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return d
}

func TestDiff(t *testing.T) {
	base := testImage(150, 70, 0)
	// draw changes one pixel of a copy of base.
	draw := func(x, y int) Image {
		img := Image{Width: base.Width, Height: base.Height, Pix: bytes.Clone(base.Pix)}
		img.Pix[(y*img.Width+x)*3] ^= 0xff
		return img
	}
	tests := []struct {
		name  string
		steps []Image
		tile  int
		// tiles sent at each step, as "x,y WxH" joined by spaces
		want []string
	}{
		{"first call sends every tile", []Image{base}, 64, []string{
			"0,0 64x64 64,0 64x64 128,0 22x64 0,64 64x6 64,64 64x6 128,64 22x6"}},
		{"nothing changed", []Image{base, base}, 64, []string{
			"0,0 64x64 64,0 64x64 128,0 22x64 0,64 64x6 64,64 64x6 128,64 22x6", ""}},
		{"one pixel changes one tile", []Image{base, draw(100, 10), draw(149, 69)}, 64, []string{
			"0,0 64x64 64,0 64x64 128,0 22x64 0,64 64x6 64,64 64x6 128,64 22x6",
			"64,0 64x64",
			"64,0 64x64 128,64 22x6"}},
		{"resize sends every tile", []Image{base, testImage(20, 10, 0)}, 64, []string{
			"0,0 64x64 64,0 64x64 128,0 22x64 0,64 64x6 64,64 64x6 128,64 22x6",
			"0,0 20x10"}},
		{"default tile", []Image{testImage(70, 10, 3)}, 0, []string{"0,0 64x10 64,0 6x10"}},
		{"tile larger than the frame", []Image{testImage(5, 5, 3)}, 100, []string{"0,0 5x5"}},
		{"small tiles are raised to MinTile", []Image{testImage(10, 10, 3), testImage(10, 10, 3)}, 1, []string{"0,0 8x8 8,0 2x8 0,8 8x2 8,8 2x2", ""}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var v View
			var client Image
			for i, cur := range tc.steps {
				reply := v.Diff(cur, tc.tile)
				d := roundTrip(t, reply, &client)
				var got []string
				for _, tl := range d.Tiles {
					got = append(got, fmt.Sprintf("%d,%d %dx%d", tl.X, tl.Y, tl.W, tl.H))
				}
				if g := strings.Join(got, " "); g != tc.want[i] {
					t.Fatalf("step %d: tiles %q, want %q", i, g, tc.want[i])
				}
				if client.Width != cur.Width || client.Height != cur.Height || !bytes.Equal(client.Pix, cur.Pix) {
					t.Fatalf("step %d: the client's frame differs from the current one", i)
				}
			}
		})
	}
}

// TestDiffViewOwnsItsCopy: a caller reusing its frame buffer does not
// corrupt the view.
func TestDiffViewOwnsItsCopy(t *testing.T) {
	var v View
	img := testImage(10, 10, 0)
	v.Diff(img, 8)
	img.Pix[0] ^= 1
	if d := v.Diff(img, 8); !bytes.HasPrefix(d, []byte("FRAMEDIFF 10 10 8 1\n0 0 8 8\n")) {
		t.Fatalf("after an in-place change: %q", d[:30])
	}
}

// TestDiffRoundTripProperty: over a sequence of random-ish frames,
// applying each reply to the client's previous frame reproduces the
// current one.
func TestDiffRoundTripProperty(t *testing.T) {
	var v View
	var client Image
	seed := uint32(1)
	rnd := func(n int) int {
		seed = seed*1664525 + 1013904223
		return int(seed>>8) % n
	}
	cur := testImage(97, 53, 0)
	for step := 0; step < 200; step++ {
		switch rnd(10) {
		case 0:
			cur = testImage(1+rnd(200), 1+rnd(120), byte(step))
		default:
			cur = Image{Width: cur.Width, Height: cur.Height, Pix: bytes.Clone(cur.Pix)}
			for range rnd(5) {
				cur.Pix[rnd(len(cur.Pix))] = byte(rnd(256))
			}
		}
		roundTrip(t, v.Diff(cur, 1+rnd(80)), &client)
		if client.Width != cur.Width || client.Height != cur.Height || !bytes.Equal(client.Pix, cur.Pix) {
			t.Fatalf("step %d: client frame differs", step)
		}
	}
}

func TestReadDiffRefuses(t *testing.T) {
	px := func(w, h int) string { return strings.Repeat("\x07", w*h*3) }
	tests := []struct {
		name, in, want string
	}{
		{"not a framediff", "SCREENDIFF 1 1 1 0\n", "header"},
		{"extra field", "FRAMEDIFF 16 16 8 0 0\n", "5 fields"},
		{"double space", "FRAMEDIFF 16  16 8\n", "not a decimal"},
		{"leading zero", "FRAMEDIFF 016 16 8 0\n", "not a decimal"},
		{"negative", "FRAMEDIFF -16 16 8 0\n", "not a decimal"},
		{"zero tile", "FRAMEDIFF 16 16 0 0\n", "tile 0 outside 8.."},
		{"tiny tile", "FRAMEDIFF 16 16 1 0\n", "tile 1 outside 8.."},
		{"huge frame", "FRAMEDIFF 8192 8192 64 0\n", "bytes of pixels"},
		{"too many tiles", "FRAMEDIFF 16 16 8 5\n", "announces 5 tiles"},
		{"long line", "FRAMEDIFF " + strings.Repeat("1", 100) + "\n", "longer than"},
		{"off grid", "FRAMEDIFF 16 16 8 1\n1 0 8 8\n" + px(8, 8), "not on the 8-pixel grid"},
		{"outside", "FRAMEDIFF 16 16 8 1\n16 0 8 8\n", "not on the"},
		{"wrong edge size", "FRAMEDIFF 17 16 8 1\n16 0 8 8\n" + px(8, 8), "want 1x8"},
		{"repeated tile", "FRAMEDIFF 16 16 8 2\n0 0 8 8\n" + px(8, 8) + "0 0 8 8\n" + px(8, 8), "repeated"},
		{"out of order", "FRAMEDIFF 16 16 8 2\n8 0 8 8\n" + px(8, 8) + "0 0 8 8\n" + px(8, 8), "order"},
		{"truncated pixels", "FRAMEDIFF 16 16 8 1\n0 0 8 8\n" + px(8, 1), "truncated"},
		{"missing tile", "FRAMEDIFF 16 16 8 2\n0 0 8 8\n" + px(8, 8), "unexpected EOF"},
		{"header without newline", "FRAMEDIFF 16 16 8 0", "unexpected EOF"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadDiff(bufio.NewReader(strings.NewReader(tc.in)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestApplyRefuses(t *testing.T) {
	frame := testImage(16, 16, 0)
	tl := func(x, y, w, h int) Tile { return Tile{X: x, Y: y, W: w, H: h, Pix: make([]byte, w*h*3)} }
	tests := []struct {
		name string
		d    Diff
		want string
	}{
		{"resize without every tile", Diff{Width: 24, Height: 16, Tile: 8, Tiles: []Tile{tl(0, 0, 8, 8)}}, "must carry all 6 tiles"},
		{"short pixels", Diff{Width: 16, Height: 16, Tile: 8, Tiles: []Tile{{X: 0, Y: 0, W: 8, H: 8, Pix: []byte{1}}}}, "bytes of pixels"},
		{"off grid", Diff{Width: 16, Height: 16, Tile: 8, Tiles: []Tile{tl(1, 1, 8, 8)}}, "grid"},
		{"repeated", Diff{Width: 16, Height: 16, Tile: 8, Tiles: []Tile{tl(0, 0, 8, 8), tl(0, 0, 8, 8)}}, "repeated"},
		{"bad tile", Diff{Width: 16, Height: 16, Tile: 0}, "tile 0"},
		{"bad size", Diff{Width: 0, Height: 16, Tile: 8}, "outside"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dst := Image{Width: frame.Width, Height: frame.Height, Pix: bytes.Clone(frame.Pix)}
			err := tc.d.Apply(&dst)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			if !bytes.Equal(dst.Pix, frame.Pix) {
				t.Fatal("a refused diff changed the frame")
			}
		})
	}
}

func TestPNG(t *testing.T) {
	img := testImage(7, 5, 9)
	var buf bytes.Buffer
	if err := img.PNG(&buf); err != nil {
		t.Fatal(err)
	}
	dec, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	for y := 0; y < img.Height; y++ {
		for x := 0; x < img.Width; x++ {
			r, g, b, a := dec.At(x, y).RGBA()
			i := (y*img.Width + x) * 3
			if byte(r>>8) != img.Pix[i] || byte(g>>8) != img.Pix[i+1] || byte(b>>8) != img.Pix[i+2] || a != 0xffff {
				t.Fatalf("pixel %d,%d differs", x, y)
			}
		}
	}
	if err := (Image{Width: 2, Height: 2}).PNG(io.Discard); err == nil {
		t.Fatal("a frame without pixels encoded")
	}
}
