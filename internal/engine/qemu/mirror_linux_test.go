package qemu

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

const mirrorPage = 4096

// mirrorFill writes n bytes of a non-zero pattern at off.
func mirrorFill(t *testing.T, f *os.File, off, n int64, seed byte) {
	t.Helper()
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i/mirrorPage) + byte(i*13)
	}
	for p := 0; p < len(b); p += mirrorPage {
		b[p] = seed | 1 // no page of it is zero
	}
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func mirrorWrite(t *testing.T, f *os.File, off int64, b []byte) {
	t.Helper()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func mirrorPunch(t *testing.T, f *os.File, off, n int64) {
	t.Helper()
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		t.Fatal(err)
	}
}

func mirrorRead(t *testing.T, f *os.File, size int64) []byte {
	t.Helper()
	b := make([]byte, size)
	if _, err := f.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

// mirrorDataPages is the set of f's pages that hold data (SEEK_DATA).
func mirrorDataPages(t *testing.T, f *os.File, size int64) map[int64]bool {
	t.Helper()
	ext, err := dataPieces(f, size, size)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for _, e := range ext {
		for p := e[0] &^ (mirrorPage - 1); p < e[1]; p += mirrorPage {
			out[p] = true
		}
	}
	return out
}

// mirrorCheck: dst holds src's bytes, data exactly where src's pages are
// not zero.
func mirrorCheck(t *testing.T, src, dst *os.File, size int64) {
	t.Helper()
	fi, err := dst.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Fatalf("dst is %d bytes, src %d", fi.Size(), size)
	}
	a, b := mirrorRead(t, src, size), mirrorRead(t, dst, size)
	data := mirrorDataPages(t, dst, size)
	for p := int64(0); p < size; p += mirrorPage {
		if !bytes.Equal(a[p:p+mirrorPage], b[p:p+mirrorPage]) {
			t.Fatalf("page %#x differs", p)
		}
		if zero := isZero(a[p : p+mirrorPage]); zero == data[p] {
			t.Fatalf("page %#x: zero %v, data in dst %v", p, zero, data[p])
		}
	}
}

// TestMirrorRefresh: after a refresh dst is src again, its zero pages
// holes, and only the pages that changed were written; both with the
// extents prepare listed (the capture's way: the changes come after it)
// and with the extents listed anew (a second refresh).
func TestMirrorRefresh(t *testing.T) {
	for _, prepared := range []bool{true, false} {
		t.Run(fmt.Sprintf("prepared=%v", prepared), func(t *testing.T) { testMirrorRefresh(t, prepared) })
	}
}

func testMirrorRefresh(t *testing.T, prepared bool) {
	const size = 8 << 20
	const P = mirrorPage
	src, err := newGuestMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if err := src.Truncate(size); err != nil {
		t.Fatal(err)
	}
	dst, err := os.Create(filepath.Join(t.TempDir(), "ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()

	mirrorFill(t, src, 0, 64<<10, 1)
	mirrorFill(t, src, 1<<20, 128<<10, 2)
	mirrorFill(t, src, 3<<20, P, 3)
	mirrorWrite(t, src, 5<<20, make([]byte, 2*P)) // data, but zero
	mirrorFill(t, src, 6<<20, 1<<20, 4)
	mirrorFill(t, src, size-P, P, 5) // the last page

	n, err := CopySparse(dst, src)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(64<<10 + 128<<10 + P + 1<<20 + P); n != want {
		t.Fatalf("CopySparse copied %d bytes, want %d", n, want)
	}
	mirrorCheck(t, src, dst, size)

	mr := &sparseMirror{src: src, dst: dst}
	if err := mr.prepare(); err != nil {
		t.Fatal(err)
	}
	defer mr.close()
	if !prepared {
		if n, err := mr.refresh(); err != nil || n != 0 {
			t.Fatalf("a refresh with nothing changed: %d bytes, %v", n, err)
		}
		if mr.srcExt != nil || mr.dstExt != nil {
			t.Fatal("a refresh kept the extents prepare listed")
		}
	}

	var changed int64
	// A page changed.
	mirrorFill(t, src, 4*P, P, 10)
	changed += P
	// Two adjacent pages changed: one run.
	mirrorFill(t, src, 1<<20+2*P, 2*P, 11)
	changed += 2 * P
	// A page rewritten with what it held: not written.
	same := mirrorRead(t, src, size)[1<<20+8*P : 1<<20+9*P]
	mirrorWrite(t, src, 1<<20+8*P, same)
	// A page zeroed: a hole, not written.
	mirrorWrite(t, src, 1<<20+16*P, make([]byte, P))
	// A hole punched in src: a hole in dst too.
	mirrorPunch(t, src, 6<<20, 256<<10)
	// A hole punched across the end of a data range and beyond.
	mirrorPunch(t, src, 64<<10-2*P, 4*P)
	// A range that was a hole now holds data.
	mirrorFill(t, src, 2<<20, 3*P, 12)
	changed += 3 * P
	// Zeroes written into a hole: data in src, still a hole in dst.
	mirrorWrite(t, src, 4<<20, make([]byte, P))
	// The zero data pages gain one non-zero page.
	mirrorFill(t, src, 5<<20+P, P, 13)
	changed += P
	// The last page changes, the page before it gains data.
	mirrorFill(t, src, size-2*P, 2*P, 14)
	changed += 2 * P

	n, err = mr.refresh()
	if err != nil {
		t.Fatal(err)
	}
	if n != changed {
		t.Errorf("refresh wrote %d bytes, %d changed", n, changed)
	}
	mirrorCheck(t, src, dst, size)
	if n, err := mr.refresh(); err != nil || n != 0 {
		t.Fatalf("a second refresh: %d bytes, %v", n, err)
	}

	// A change of size is refused.
	if err := src.Truncate(size + P); err != nil {
		t.Fatal(err)
	}
	if _, err := mr.refresh(); err == nil {
		t.Fatal("a refresh after src changed size succeeded")
	}
	mr.close()
	if mr.srcMap != nil || mr.dstMap != nil {
		t.Fatal("close left a map")
	}
	mr.close() // twice is harmless
}

// TestMirrorEmpty: an empty src maps nothing and refreshes to nothing.
func TestMirrorEmpty(t *testing.T) {
	src, err := newGuestMemory()
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(filepath.Join(t.TempDir(), "ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	mr := &sparseMirror{src: src, dst: dst}
	if err := mr.prepare(); err != nil {
		t.Fatal(err)
	}
	if n, err := mr.refresh(); n != 0 || err != nil {
		t.Fatalf("%d, %v", n, err)
	}
	mr.close()
}

type extentList = [][2]int64

func TestSplitExtents(t *testing.T) {
	const P = 4096
	cases := []struct {
		name          string
		in            extentList
		first, second extentList
	}{
		{"none", nil, nil, nil},
		{"one page", extentList{{0, P}}, nil, extentList{{0, P}}},
		{"one extent", extentList{{0, 4 * P}}, extentList{{0, 2 * P}}, extentList{{2 * P, 4 * P}}},
		{"odd pages", extentList{{P, 4 * P}}, extentList{{P, 2 * P}}, extentList{{2 * P, 4 * P}}},
		{"two equal", extentList{{0, P}, {2 * P, 3 * P}}, extentList{{0, P}}, extentList{{2 * P, 3 * P}}},
		{"cut in the second", extentList{{0, P}, {10 * P, 15 * P}}, extentList{{0, P}, {10 * P, 12 * P}}, extentList{{12 * P, 15 * P}}},
		{"cut in the first", extentList{{0, 7 * P}, {10 * P, 11 * P}}, extentList{{0, 4 * P}}, extentList{{4 * P, 7 * P}, {10 * P, 11 * P}}},
		{"ends on the half", extentList{{0, P}, {2 * P, 3 * P}, {5 * P, 7 * P}}, extentList{{0, P}, {2 * P, 3 * P}}, extentList{{5 * P, 7 * P}}},
		{"many", extentList{{0, P}, {2 * P, 3 * P}, {4 * P, 5 * P}, {6 * P, 7 * P}, {8 * P, 9 * P}, {10 * P, 11 * P}},
			extentList{{0, P}, {2 * P, 3 * P}, {4 * P, 5 * P}}, extentList{{6 * P, 7 * P}, {8 * P, 9 * P}, {10 * P, 11 * P}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := splitExtents(c.in)
			if len(got) != 2 {
				t.Fatalf("%d lists", len(got))
			}
			if fmt.Sprint(got[0]) != fmt.Sprint(c.first) || fmt.Sprint(got[1]) != fmt.Sprint(c.second) {
				t.Fatalf("got %v | %v, want %v | %v", got[0], got[1], c.first, c.second)
			}
			// Together they are the input, cut on a page.
			var total, firstBytes int64
			for _, e := range c.in {
				total += e[1] - e[0]
			}
			for _, e := range got[0] {
				firstBytes += e[1] - e[0]
				if e[0]%P != 0 || e[1]%P != 0 {
					t.Fatalf("extent %v is not page aligned", e)
				}
			}
			if firstBytes != (total/2)&^(P-1) {
				t.Fatalf("the first half has %d of %d bytes", firstBytes, total)
			}
		})
	}
}

func TestSubtractExtents(t *testing.T) {
	cases := []struct {
		name    string
		a, b    extentList
		want    extentList
		comment string
	}{
		{name: "nothing", a: nil, b: extentList{{0, 10}}, want: nil},
		{name: "nothing to subtract", a: extentList{{0, 10}, {20, 30}}, b: nil, want: extentList{{0, 10}, {20, 30}}},
		{name: "the same", a: extentList{{0, 10}, {20, 30}}, b: extentList{{0, 10}, {20, 30}}, want: nil},
		{name: "covered wider", a: extentList{{5, 10}}, b: extentList{{0, 100}}, want: nil},
		{name: "disjoint", a: extentList{{10, 20}}, b: extentList{{0, 5}, {20, 30}}, want: extentList{{10, 20}}},
		{name: "head", a: extentList{{0, 10}}, b: extentList{{0, 4}}, want: extentList{{4, 10}}},
		{name: "tail", a: extentList{{0, 10}}, b: extentList{{6, 12}}, want: extentList{{0, 6}}},
		{name: "middle", a: extentList{{0, 10}}, b: extentList{{3, 5}}, want: extentList{{0, 3}, {5, 10}}},
		{name: "several inside", a: extentList{{0, 20}}, b: extentList{{2, 4}, {6, 8}, {18, 20}}, want: extentList{{0, 2}, {4, 6}, {8, 18}}},
		{name: "across two", a: extentList{{0, 10}, {20, 30}}, b: extentList{{5, 25}}, want: extentList{{0, 5}, {25, 30}}},
		{name: "b before and after", a: extentList{{10, 20}, {30, 40}}, b: extentList{{0, 12}, {15, 16}, {19, 31}, {39, 50}}, want: extentList{{12, 15}, {16, 19}, {31, 39}}},
		{name: "b in the gaps", a: extentList{{0, 10}, {20, 30}, {40, 50}}, b: extentList{{10, 20}, {30, 40}}, want: extentList{{0, 10}, {20, 30}, {40, 50}}},
		{name: "b ends where a starts", a: extentList{{10, 20}}, b: extentList{{0, 10}, {20, 30}}, want: extentList{{10, 20}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := subtractExtents(c.a, c.b)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("got %v, want %v", got, c.want)
			}
		})
	}
}

// TestRAMFileWriter: pages written in runs, zero pages as holes where
// data was, the file right after a flush.
func TestRAMFileWriter(t *testing.T) {
	const P = streamPage
	const pages = 600 // past one run of ramRunMax, ten words of bits
	const size = pages * P
	f, err := os.Create(filepath.Join(t.TempDir(), "ram"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	w := &ramFileWriter{f: f}
	w.size(pages * P)
	model := make([]byte, size)
	put := func(n int64, seed byte) {
		t.Helper()
		p := testPage(seed)
		if err := w.page(n*P, p); err != nil {
			t.Fatalf("page %d: %v", n, err)
		}
		copy(model[n*P:], p)
	}
	zero := func(n int64) {
		t.Helper()
		if err := w.page(n*P, nil); err != nil {
			t.Fatalf("zero page %d: %v", n, err)
		}
		clear(model[n*P : (n+1)*P])
	}
	state := func(bytes int64, runOff int64, runLen int) {
		t.Helper()
		if w.bytes != bytes || len(w.run) != runLen || (runLen > 0 && w.runOff != runOff) {
			t.Fatalf("written %d, run of %d at %#x; want %d, %d at %#x", w.bytes, len(w.run), w.runOff, bytes, runLen, runOff)
		}
	}

	// In order: one run, nothing written yet.
	put(0, 1)
	put(1, 2)
	put(2, 3)
	state(0, 0, 3*P)
	// Out of order: the run is written, another begins.
	put(10, 4)
	state(3*P, 10*P, P)
	put(5, 5)
	state(4*P, 5*P, P)
	put(6, 6)
	state(4*P, 5*P, 2*P)
	// The same page again: a new run.
	put(6, 7)
	state(6*P, 6*P, P)
	// A zero page over an unwritten page: nothing at all.
	zero(20)
	state(6*P, 6*P, P)
	// A zero page over a written page: a hole.
	zero(1)
	state(7*P, 0, 0)
	// A zero page over a page of the pending run: written, then a hole.
	put(30, 8)
	put(31, 9)
	zero(31)
	state(9*P, 0, 0)
	// A page past the end.
	if err := w.page(size+64*P, testPage(1)); err == nil {
		t.Fatal("a page past the end was taken")
	}
	// A long run is cut at ramRunMax.
	for n := int64(100); n < 100+ramRunMax/P+1; n++ {
		put(n, byte(n))
	}
	state(9*P+ramRunMax, 100*P+ramRunMax, P)
	// Then zeroed in part: the pending run is written first.
	zero(150)
	zero(100 + ramRunMax/P)
	put(pages-1, 99)
	if err := w.flush(); err != nil {
		t.Fatal(err)
	}
	if err := w.flush(); err != nil { // nothing pending
		t.Fatal(err)
	}

	got := mirrorRead(t, f, size)
	data := mirrorDataPages(t, f, size)
	for p := int64(0); p < size; p += P {
		if !bytes.Equal(got[p:p+P], model[p:p+P]) {
			t.Fatalf("page %d differs", p/P)
		}
		if zero := isZero(model[p : p+P]); zero == data[p] {
			t.Fatalf("page %d: zero %v, data in the file %v", p/P, zero, data[p])
		}
	}
	for n := int64(0); n < pages; n++ {
		bit := w.written[n/64]&(1<<(n%64)) != 0
		if want := !isZero(model[n*P : (n+1)*P]); bit != want {
			t.Fatalf("page %d: written bit %v, want %v", n, bit, want)
		}
	}
	if fi, _ := f.Stat(); fi.Size() != size {
		t.Fatalf("the file grew to %d bytes", fi.Size())
	}

	t.Run("page just past the end", func(t *testing.T) {
		w := &ramFileWriter{f: f}
		w.size(8 * P)
		if err := w.page(8*P, testPage(1)); err == nil {
			t.Fatal("a page past the end of an 8-page block was taken")
		}
	})
	t.Run("negative offset", func(t *testing.T) {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("panic: %v", r)
			}
		}()
		w := &ramFileWriter{f: f}
		w.size(8 * P)
		if err := w.page(-1<<63, testPage(1)); err == nil {
			t.Fatal("a negative offset was taken")
		}
	})
}

// withNewData adds the data a file gained in the holes between the
// extents it was listed with, and keeps the listed ones as they are.
func TestWithNewData(t *testing.T) {
	const P = mirrorPage
	const size = 64 * P
	cases := []struct {
		name   string
		listed extentList // what was listed (written before the call too)
		added  extentList // written after the listing
		want   extentList
	}{
		{"nothing anywhere", nil, nil, nil},
		{"nothing new", extentList{{0, 2 * P}, {10 * P, 12 * P}}, nil, extentList{{0, 2 * P}, {10 * P, 12 * P}}},
		{"all new", nil, extentList{{3 * P, 4 * P}, {63 * P, 64 * P}}, extentList{{3 * P, 4 * P}, {63 * P, 64 * P}}},
		{"inside a hole", extentList{{0, P}, {20 * P, 21 * P}}, extentList{{5 * P, 7 * P}}, extentList{{0, P}, {5 * P, 7 * P}, {20 * P, 21 * P}}},
		{"before the first", extentList{{8 * P, 9 * P}}, extentList{{0, P}}, extentList{{0, P}, {8 * P, 9 * P}}},
		{"after the last", extentList{{8 * P, 9 * P}}, extentList{{60 * P, 61 * P}}, extentList{{8 * P, 9 * P}, {60 * P, 61 * P}}},
		{"touching the next", extentList{{8 * P, 16 * P}}, extentList{{6 * P, 8 * P}}, extentList{{6 * P, 16 * P}}},
		{"touching the last", extentList{{8 * P, 16 * P}}, extentList{{16 * P, 17 * P}}, extentList{{8 * P, 17 * P}}},
		{"filling a hole", extentList{{0, 4 * P}, {8 * P, 12 * P}}, extentList{{4 * P, 8 * P}}, extentList{{0, 12 * P}}},
		{"several in one hole", extentList{{40 * P, 41 * P}}, extentList{{2 * P, 3 * P}, {5 * P, 6 * P}, {30 * P, 33 * P}}, extentList{{2 * P, 3 * P}, {5 * P, 6 * P}, {30 * P, 33 * P}, {40 * P, 41 * P}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := newGuestMemory()
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Truncate(size); err != nil {
				t.Fatal(err)
			}
			for _, e := range c.listed {
				mirrorFill(t, f, e[0], e[1]-e[0], 1)
			}
			listed, err := dataPieces(f, size, size)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(listed) != fmt.Sprint(c.listed) {
				t.Fatalf("the memfd lists %v, the case %v", listed, c.listed)
			}
			for _, e := range c.added {
				mirrorFill(t, f, e[0], e[1]-e[0], 2)
			}
			got, err := withNewData(f, listed, size)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("withNewData = %v, want %v", got, c.want)
			}
			// It is what listing the file again finds.
			if again, _ := dataPieces(f, size, size); fmt.Sprint(again) != fmt.Sprint(got) {
				t.Fatalf("withNewData = %v, a new listing %v", got, again)
			}
		})
	}
}
