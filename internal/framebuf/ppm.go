// Package framebuf holds a guest display's frames: the binary PPM (P6)
// images QEMU's screendump writes, the tiled FRAMEDIFF replies nether
// serves from them (per client, only the tiles that changed), and the
// client-side decoders of both. Everything read from the wire or from
// the engine is bounded before anything is allocated.
package framebuf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"strconv"
)

// Bounds of any frame read or produced. A guest display is at most a
// few megapixels; these stop a hostile header from making a reader
// allocate or wait for gigabytes.
const (
	MaxWidth    = 8192
	MaxHeight   = 8192
	MaxPixBytes = 64 << 20 // width*height*3
)

// maxHeader bounds a PPM header, comments included: QEMU writes about 15
// bytes, and a reader must not skip an endless comment.
const maxHeader = 4096

// Image is one frame: RGB, 3 bytes per pixel, row-major, no padding.
type Image struct {
	Width, Height int
	Pix           []byte
}

// ErrFormat is wrapped by every error about malformed or out-of-bounds
// input.
var ErrFormat = errors.New("malformed frame")

func formatErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrFormat}, args...)...)
}

// checkSize refuses sizes outside the bounds.
func checkSize(w, h int) error {
	if w < 1 || h < 1 || w > MaxWidth || h > MaxHeight {
		return formatErr("frame size %dx%d outside 1x1..%dx%d", w, h, MaxWidth, MaxHeight)
	}
	if w*h*3 > MaxPixBytes {
		return formatErr("frame size %dx%d is more than %d bytes of pixels", w, h, MaxPixBytes)
	}
	return nil
}

// Check says whether img is a well-formed frame.
func (img Image) Check() error {
	if err := checkSize(img.Width, img.Height); err != nil {
		return err
	}
	if len(img.Pix) != img.Width*img.Height*3 {
		return formatErr("%dx%d frame has %d bytes of pixels, want %d", img.Width, img.Height, len(img.Pix), img.Width*img.Height*3)
	}
	return nil
}

// PPM returns img in the one form nether serves: "P6\n<w> <h>\n255\n"
// then the pixels.
func (img Image) PPM() []byte {
	b := make([]byte, 0, 32+len(img.Pix))
	b = fmt.Appendf(b, "P6\n%d %d\n255\n", img.Width, img.Height)
	return append(b, img.Pix...)
}

// ParsePPM parses exactly one binary PPM with maxval 255, as QEMU's
// screendump writes it. The general P6 header grammar is accepted
// (whitespace runs, '#' comments); anything after the pixels is refused.
func ParsePPM(b []byte) (Image, error) {
	r := bufio.NewReader(bytes.NewReader(b))
	img, err := ReadPPM(r)
	if err != nil {
		return Image{}, err
	}
	if r.Buffered() > 0 {
		return Image{}, formatErr("%d bytes of trailing data after the PPM pixels", r.Buffered())
	}
	return img, nil
}

// ReadPPM reads exactly one binary PPM (maxval 255) from r, leaving r at
// the byte after its last pixel. A stream that ends early is an
// io.ErrUnexpectedEOF (io.EOF only when r was empty).
func ReadPPM(r *bufio.Reader) (Image, error) {
	h := headerReader{r: r}
	var magic [2]byte
	for i := range magic {
		c, err := h.byte()
		if err != nil {
			if i == 0 && err == io.EOF {
				return Image{}, io.EOF
			}
			return Image{}, fmt.Errorf("reading PPM magic: %w", eofUnexpected(err))
		}
		magic[i] = c
	}
	if magic != [2]byte{'P', '6'} {
		return Image{}, formatErr("not a binary PPM: magic %q, want \"P6\"", magic[:])
	}
	var nums [3]int
	for i, name := range []string{"width", "height", "maxval"} {
		n, err := h.number(name, i > 0)
		if err != nil {
			return Image{}, err
		}
		nums[i] = n
	}
	w, ht, maxval := nums[0], nums[1], nums[2]
	if maxval != 255 {
		return Image{}, formatErr("PPM maxval %d: only 255 is supported", maxval)
	}
	if err := checkSize(w, ht); err != nil {
		return Image{}, err
	}
	// number stopped at the single whitespace byte that ends the header
	// and consumed it; the pixels start here.
	pix := make([]byte, w*ht*3)
	if _, err := io.ReadFull(r, pix); err != nil {
		return Image{}, formatErr("PPM %dx%d truncated: %v", w, ht, eofUnexpected(err))
	}
	return Image{Width: w, Height: ht, Pix: pix}, nil
}

// headerReader reads a PPM header a byte at a time, within maxHeader.
type headerReader struct {
	r *bufio.Reader
	n int
}

func (h *headerReader) byte() (byte, error) {
	if h.n >= maxHeader {
		return 0, formatErr("PPM header longer than %d bytes", maxHeader)
	}
	h.n++
	return h.r.ReadByte()
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

// number skips whitespace and comments, reads a decimal number, and
// consumes the one whitespace byte that must follow it. sawSpace says
// whitespace was already consumed (the previous number's terminator).
func (h *headerReader) number(name string, sawSpace bool) (int, error) {
	c, err := h.byte()
	for err == nil {
		if isSpace(c) {
			sawSpace = true
		} else if c == '#' {
			// A comment runs to the end of its line and counts as
			// whitespace.
			for err == nil && c != '\n' && c != '\r' {
				c, err = h.byte()
			}
			sawSpace = true
			if err != nil {
				break
			}
		} else {
			break
		}
		c, err = h.byte()
	}
	if err != nil {
		return 0, fmt.Errorf("reading PPM %s: %w", name, eofUnexpected(err))
	}
	if !sawSpace {
		return 0, formatErr("PPM %s: no whitespace before it", name)
	}
	n, digits := 0, 0
	for ; err == nil && c >= '0' && c <= '9'; c, err = h.byte() {
		digits++
		if digits > 9 {
			return 0, formatErr("PPM %s has more than 9 digits", name)
		}
		n = n*10 + int(c-'0')
	}
	if err != nil {
		return 0, fmt.Errorf("reading PPM %s: %w", name, eofUnexpected(err))
	}
	if digits == 0 {
		return 0, formatErr("PPM %s: %q is not a digit", name, c)
	}
	if !isSpace(c) {
		return 0, formatErr("PPM %s: %q after the number, want whitespace", name, c)
	}
	return n, nil
}

func eofUnexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ToRGBA converts img for the image packages.
func (img Image) ToRGBA() *image.RGBA {
	out := image.NewRGBA(image.Rect(0, 0, img.Width, img.Height))
	for i, j := 0, 0; i+2 < len(img.Pix) && j+3 < len(out.Pix); i, j = i+3, j+4 {
		out.Pix[j], out.Pix[j+1], out.Pix[j+2], out.Pix[j+3] = img.Pix[i], img.Pix[i+1], img.Pix[i+2], 0xff
	}
	return out
}

// PNG writes img as a PNG.
func (img Image) PNG(w io.Writer) error {
	if err := img.Check(); err != nil {
		return err
	}
	if err := png.Encode(w, img.ToRGBA()); err != nil {
		return fmt.Errorf("encoding a %dx%d frame as PNG: %w", img.Width, img.Height, err)
	}
	return nil
}

// atoiStrict parses a canonical non-negative decimal: digits only, no
// sign, no leading zero, at most 9 digits.
func atoiStrict(s string) (int, bool) {
	if s == "" || len(s) > 9 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}
