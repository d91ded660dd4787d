package qemu

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestPrivateRAMRefresh maps a file privately in this process, as QEMU
// maps a fork's RAM, writes some of its pages (copy-on-write), and checks
// that refresh brings a copy of the file to what the map holds now,
// writing only the pages the map owns and that differ.
// It runs with each way of reading QEMU's memory: PAGEMAP_SCAN and
// process_vm_readv, and the page map and /proc/PID/mem they fall back to.
func TestPrivateRAMRefresh(t *testing.T) {
	for _, mode := range privateModes {
		t.Run(mode.name, func(t *testing.T) { testPrivateRAMRefresh(t, mode.old) })
	}
}

// mapPrivately writes content to file and maps it privately, writable,
// as QEMU maps a fork's RAM: a write makes the page the map's own.
func mapPrivately(t *testing.T, file string, content []byte) []byte {
	t.Helper()
	if err := os.WriteFile(file, content, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() // the map outlives the descriptor
	mem, err := unix.Mmap(int(f.Fd()), 0, len(content), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	return mem
}

var privateModes = []struct {
	name string
	old  bool // the page map read and /proc/PID/mem
}{{"scan and process_vm_readv", false}, {"pagemap and proc mem", true}}

// openPrivateRAMAs is openPrivateRAM forced to the old ways when old is
// set; otherwise it says loudly when the kernel has not the new ones.
func openPrivateRAMAs(t *testing.T, file string, size int64, old bool) *privateRAM {
	t.Helper()
	p, err := openPrivateRAM(os.Getpid(), file, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	p.noScan, p.noVMRead = old, old
	if !old {
		if _, err := p.ownPages(); err != nil {
			t.Fatal(err)
		}
		if p.noScan {
			t.Log("WARNING: this kernel has no PAGEMAP_SCAN (Linux 6.7): the scan is not tested, only its fallback")
		}
	}
	return p
}

func testPrivateRAMRefresh(t *testing.T, oldWays bool) {
	const P = 4096
	const size = 64 * P
	dir := t.TempDir()
	file := filepath.Join(dir, "ram")
	orig := make([]byte, size)
	for i := range orig {
		orig[i] = byte(i / P)
	}
	copy(orig[10*P:11*P], make([]byte, P)) // a zero page in the file
	mem := mapPrivately(t, file, orig)
	// Read every page (file pages, not the map's own), then write some.
	var sum byte
	for p := 0; p < size; p += P {
		sum += mem[p]
	}
	_ = sum
	mem[3*P] = 0xaa                                  // changed
	copy(mem[4*P:6*P], bytes.Repeat([]byte{7}, 2*P)) // a run of two
	mem[8*P+5] = orig[8*P+5]                         // written with what it held: owned, same
	copy(mem[12*P:13*P], make([]byte, P))            // became zero
	mem[10*P+1] = 1                                  // the zero page, now data

	// dst: what the passes wrote, the file as it was.
	dst, err := os.OpenFile(filepath.Join(dir, "copy"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := dst.WriteAt(orig, 0); err != nil {
		t.Fatal(err)
	}
	p := openPrivateRAMAs(t, file, size, oldWays)
	runs, err := p.ownPages()
	if err != nil {
		t.Fatal(err)
	}
	owned := map[int64]bool{}
	for _, r := range runs {
		for o := r[0]; o < r[1]; o += P {
			owned[o/P] = true
		}
	}
	for _, pg := range []int64{3, 4, 5, 8, 10, 12} {
		if !owned[pg] {
			t.Errorf("page %d was written but is not listed as the map's own (runs %v)", pg, runs)
		}
	}
	if len(owned) != 6 {
		t.Errorf("own pages %v, want 3 4 5 8 10 12", runs)
	}
	n, err := p.refreshRuns(dst, runs)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, size)
	if _, err := dst.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, mem) {
		t.Fatal("after refresh the copy differs from the map")
	}
	// 3, 4, 5 and 10 written; 12 punched; 8 unchanged.
	if n != 4*P {
		t.Errorf("refresh wrote %d bytes, want %d", n, 4*P)
	}
	if off, err := unix.Seek(int(dst.Fd()), 12*P, unix.SEEK_DATA); err != nil || off == 12*P {
		t.Errorf("the page that became zero is not a hole (SEEK_DATA from it: %d %v)", off, err)
	}
	if n, err := p.refreshRuns(dst, runs); err != nil || n != 0 {
		t.Errorf("a second refresh wrote %d bytes (%v), want 0", n, err)
	}
}

// TestPrivateRAMManyRuns: more runs than one PAGEMAP_SCAN call returns
// and one process_vm_readv call reads (1024 each), listed and read the
// same both ways.
func TestPrivateRAMManyRuns(t *testing.T) {
	const P = 4096
	const pages = 5000
	const size = pages * P
	file := filepath.Join(t.TempDir(), "ram")
	mem := mapPrivately(t, file, make([]byte, size))
	var want [][2]int64
	for pg := int64(0); pg < pages; pg++ {
		_ = mem[pg*P] // a file page
		if pg%3 == 0 || (pg > 3000 && pg < 3600) {
			mem[pg*P+7] = byte(pg) | 1 // the map's own
			want = appendExtent(want, [2]int64{pg * P, pg*P + P}, ownRunMax)
		}
	}
	if len(want) < 1100 {
		t.Fatalf("only %d runs: the test needs more than 1024", len(want))
	}
	for _, mode := range privateModes {
		p := openPrivateRAMAs(t, file, size, mode.old)
		runs, err := p.ownPages()
		if err != nil {
			t.Fatalf("%s: %v", mode.name, err)
		}
		if fmt.Sprint(runs) != fmt.Sprint(want) {
			t.Fatalf("%s: %d runs, want %d (first %v, want %v)", mode.name, len(runs), len(want), runs[:min(3, len(runs))], want[:3])
		}
		var total int64
		for _, r := range runs {
			total += r[1] - r[0]
		}
		buf := make([]byte, total)
		if err := p.readRuns(buf, runs); err != nil {
			t.Fatalf("%s: %v", mode.name, err)
		}
		at := int64(0)
		for _, r := range runs {
			if !bytes.Equal(buf[at:at+r[1]-r[0]], mem[r[0]:r[1]]) {
				t.Fatalf("%s: run %v read otherwise than the map holds it", mode.name, r)
			}
			at += r[1] - r[0]
		}
	}
}

func TestFindFileMappingRefusesOthers(t *testing.T) {
	maps := filepath.Join(t.TempDir(), "maps")
	text := "7f0000000000-7f0000010000 rw-p 00000000 fd:01 1234 /a/ram\n" +
		"7f1000000000-7f1000020000 rw-p 00001000 fd:01 99 /b/ram\n" + // not from the start
		"7f2000000000-7f2000020000 rw-p 00000000 fd:02 99 /c/ram\n" + // another device
		"7f3000000000-7f3000010000 rw-p 00000000 fd:01 99 /d/ram\n" + // another size
		"7f4000000000-7f4000020000 rw-p 00000000 fd:01 99 /e/ram (deleted)\n"
	if err := os.WriteFile(maps, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	dev := unix.Mkdev(0xfd, 1)
	base, err := findFileMapping(maps, dev, 99, 0x20000)
	if err != nil || base != 0x7f4000000000 {
		t.Fatalf("findFileMapping = %#x, %v; want the whole-file mapping of inode 99 on fd:01", base, err)
	}
	if _, err := findFileMapping(maps, dev, 5, 0x20000); err == nil {
		t.Fatal("found a mapping of an inode that has none")
	}
}
