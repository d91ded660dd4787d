package framebuf

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzParsePPM: arbitrary bytes never panic; whatever parses is within
// bounds and re-encodes to a PPM that parses to the same image.
func FuzzParsePPM(f *testing.F) {
	f.Add([]byte("P6\n2 1\n255\n\x00\x01\x02\x03\x04\x05"))
	f.Add([]byte("P6 #c\n2\t1 255\r\x00\x01\x02\x03\x04\x05"))
	f.Add([]byte("P6\n2 1\n65535\n"))
	f.Add([]byte("P6\n8192 8192\n255\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := ParsePPM(b)
		if err != nil {
			return
		}
		if err := img.Check(); err != nil {
			t.Fatalf("parsed a bad image: %v", err)
		}
		again, err := ParsePPM(img.PPM())
		if err != nil || again.Width != img.Width || again.Height != img.Height || !bytes.Equal(again.Pix, img.Pix) {
			t.Fatalf("canonical form does not round-trip: %v", err)
		}
	})
}

// FuzzReadPPM: a stream reader never panics, never reads past the image
// it returns, and agrees with ParsePPM on the bytes it consumed.
func FuzzReadPPM(f *testing.F) {
	f.Add([]byte("P6\n1 1\n255\nabcP6\n1 1\n255\ndef"))
	f.Add([]byte("P6\n1 1\n255\nab"))
	f.Add([]byte("P6\n# x\n1 1 255\nabc"))
	f.Fuzz(func(t *testing.T, b []byte) {
		br := bytes.NewReader(b)
		r := bufio.NewReaderSize(br, 16)
		img, err := ReadPPM(r)
		if err != nil {
			return
		}
		n := len(b) - br.Len() - r.Buffered()
		got, err := ParsePPM(b[:n])
		if err != nil {
			t.Fatalf("ReadPPM read %dx%d from %q that ParsePPM refuses: %v", img.Width, img.Height, b[:n], err)
		}
		if !bytes.Equal(got.Pix, img.Pix) {
			t.Fatal("ReadPPM and ParsePPM disagree on the pixels")
		}
	})
}

// FuzzReadDiff: arbitrary bytes never panic; a diff that decodes applies
// cleanly onto a frame of its size, and onto an empty frame exactly when
// it carries every tile.
func FuzzReadDiff(f *testing.F) {
	var v View
	f.Add(v.Diff(testImage(20, 11, 1), 8))
	f.Add(v.Diff(testImage(20, 11, 2), 8))
	f.Add(v.Diff(testImage(20, 11, 2), 8))
	f.Add([]byte("FRAMEDIFF 9 9 8 1\n8 8 1 1\n012"))
	f.Add([]byte("FRAMEDIFF 8192 8192 8 0\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ReadDiff(bufio.NewReader(bytes.NewReader(b)))
		if err != nil {
			return
		}
		if d.Width*d.Height*3 > 1<<20 {
			return // valid, but too big to apply at fuzzing speed
		}
		dst := Image{Width: d.Width, Height: d.Height, Pix: make([]byte, d.Width*d.Height*3)}
		if err := d.Apply(&dst); err != nil {
			t.Fatalf("a decoded diff does not apply: %v", err)
		}
		var empty Image
		all := ceilDiv(d.Width, d.Tile) * ceilDiv(d.Height, d.Tile)
		if err := d.Apply(&empty); (err == nil) != (len(d.Tiles) == all) {
			t.Fatalf("apply onto an empty frame with %d of %d tiles: %v", len(d.Tiles), all, err)
		}
	})
}
