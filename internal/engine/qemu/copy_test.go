package qemu

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestCopySparse: data survives byte for byte, holes and zero pages stay
// holes.
func TestCopySparse(t *testing.T) {
	dir := t.TempDir()
	src, err := os.Create(filepath.Join(dir, "src"))
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	src.Truncate(size)
	blob := make([]byte, 3<<20+123)
	rand.Read(blob)
	for _, off := range []int64{0, 5 << 20, 17<<20 + 4096, size - int64(len(blob))} {
		src.WriteAt(blob, off)
	}
	// An explicit run of zero pages inside data: must not be written.
	src.WriteAt(make([]byte, 1<<20), 30<<20)
	dst, err := os.Create(filepath.Join(dir, "dst"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := CopySparse(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src.Name())
	b, _ := os.ReadFile(dst.Name())
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs from the source")
	}
	if n > int64(4*len(blob)+4*4096) {
		t.Fatalf("copied %d bytes: zero pages or holes were written", n)
	}
	fi, _ := dst.Stat()
	if fi.Size() != size {
		t.Fatalf("size %d", fi.Size())
	}
}

// TestMendPages: dst ends up holding cur; only the pages that differ
// from old are written, and a page that became zero is a hole.
func TestMendPages(t *testing.T) {
	const P = 4096
	// A page pattern: 0 is a zero page, any other letter a page filled
	// with it.
	pages := func(pattern string) []byte {
		b := make([]byte, 0, len(pattern)*P)
		for _, c := range pattern {
			fill := byte(0)
			if c != '0' {
				fill = byte(c)
			}
			b = append(b, bytes.Repeat([]byte{fill}, P)...)
		}
		return b
	}
	cases := []struct {
		name     string
		old      string // "" is a hole (mendPages's nil)
		cur      string
		written  int    // pages written
		wantData string // 'd' where dst must hold data, 'h' a hole
	}{
		{"a fresh copy", "", "a0bb0", 3, "dhddh"},
		{"all zero, fresh", "", "000", 0, "hhh"},
		{"nothing changed", "abc", "abc", 0, "ddd"},
		{"one page changed", "abc", "axc", 1, "ddd"},
		{"a run changed", "abcd", "axyd", 2, "dddd"},
		{"a page became zero", "abc", "a0c", 0, "dhd"},
		{"a zero page gained data", "a0c", "abc", 1, "ddd"},
		{"zero data stays data", "a0c", "a0c", 0, "ddd"},
		{"changes around a zeroed page", "abcde", "x0y0e", 2, "dhdhd"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst, err := os.Create(filepath.Join(t.TempDir(), "dst"))
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			cur := pages(c.cur)
			if err := dst.Truncate(int64(len(cur)) + 2*P); err != nil { // room after: off below
				t.Fatal(err)
			}
			const off = 2 * P
			var old []byte
			if c.old != "" {
				old = pages(c.old)
				if _, err := dst.WriteAt(old, off); err != nil {
					t.Fatal(err)
				}
			}
			n, err := mendPages(dst, off, cur, old)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(c.written*P) {
				t.Errorf("wrote %d bytes, want %d pages", n, c.written)
			}
			got := make([]byte, len(cur))
			if _, err := dst.ReadAt(got, off); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, cur) {
				t.Fatal("dst does not hold cur")
			}
			data := mirrorDataPages(t, dst, int64(len(cur))+off)
			for i, w := range c.wantData {
				if data[off+int64(i)*P] != (w == 'd') {
					t.Errorf("page %d: data %v, want %c", i, data[off+int64(i)*P], w)
				}
			}
		})
	}
	// A last page cut short is mended like a whole one.
	dst, err := os.Create(filepath.Join(t.TempDir(), "short"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	cur := append(pages("a"), bytes.Repeat([]byte{'b'}, 100)...)
	if n, err := mendPages(dst, 0, cur, nil); err != nil || n != int64(len(cur)) {
		t.Fatalf("mendPages = %d, %v; want %d", n, err, len(cur))
	}
	if got, _ := os.ReadFile(dst.Name()); !bytes.Equal(got, cur) {
		t.Fatal("the short page was not written whole")
	}
}

// BenchmarkCopySparse: a 512 MiB tmpfs file with 150 MiB of data, copied
// to the test's temporary directory, as __snapshot__ does while paused.
func BenchmarkCopySparse(b *testing.B) {
	shm, err := os.MkdirTemp("/dev/shm", "copy-bench-")
	if err != nil {
		b.Skip("no /dev/shm")
	}
	defer os.RemoveAll(shm)
	src, _ := os.Create(filepath.Join(shm, "ram"))
	src.Truncate(512 << 20)
	blob := make([]byte, 1<<20)
	rand.Read(blob)
	for i := int64(0); i < 150; i++ {
		src.WriteAt(blob, i*3<<20)
	}
	dir := b.TempDir()
	b.SetBytes(150 << 20)
	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		dst, _ := os.Create(filepath.Join(dir, "ram"))
		t0 := time.Now()
		if _, err := CopySparse(dst, src); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		// As a capture does after resuming: flush, so the next copy does
		// not queue behind this one's writeback.
		b.StopTimer()
		dst.Sync()
		dst.Close()
		os.Remove(dst.Name())
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/copy")
}
