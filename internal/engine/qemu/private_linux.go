package qemu

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// privateRAM is guest RAM QEMU maps privately from an artifact's "ram"
// file (a fork), as nether reads it in QEMU's memory: /proc/PID/mem for
// its bytes, /proc/PID/pagemap for which pages are the guest's own.
//
// A live capture of such RAM takes QEMU's passes for the bulk, but under
// TCG QEMU 7.2 loses some of the writes made during them: clearing its
// dirty bits between passes does not re-arm the write check of pages
// the vCPU's TLB already holds, so a kernel page written through a
// cached entry is never sent again (seen by hand: a busy fork parked live
// woke with a corrupt kernel one time in three; stopped first, never).
// The kernel knows better: every page the guest wrote since the restore
// is an anonymous copy in QEMU's private map, every other page is still
// the artifact's and was sent as it is. So in the pause nether compares
// the anonymous pages with what the passes wrote and rewrites the ones
// that differ.
type privateRAM struct {
	mem, pagemap *os.File
	base, size   int64
}

// openPrivateRAM finds the mapping of file (the artifact's RAM, size
// bytes) in QEMU's (pid) memory.
func openPrivateRAM(pid int, file string, size int64) (*privateRAM, error) {
	var st unix.Stat_t
	if err := unix.Stat(file, &st); err != nil {
		return nil, fmt.Errorf("finding guest memory: %w", err)
	}
	base, err := findFileMapping(fmt.Sprintf("/proc/%d/maps", pid), st.Dev, st.Ino, size)
	if err != nil {
		return nil, err
	}
	p := &privateRAM{base: base, size: size}
	if p.mem, err = os.Open(fmt.Sprintf("/proc/%d/mem", pid)); err != nil {
		return nil, fmt.Errorf("opening QEMU's memory: %w", err)
	}
	if p.pagemap, err = os.Open(fmt.Sprintf("/proc/%d/pagemap", pid)); err != nil {
		p.mem.Close()
		return nil, fmt.Errorf("opening QEMU's page map: %w", err)
	}
	return p, nil
}

func (p *privateRAM) close() {
	p.mem.Close()
	p.pagemap.Close()
}

// findFileMapping returns the start of the mapping of the whole file
// (device dev, inode ino, size bytes) in a /proc/PID/maps file: by
// inode, not path, so a path that changed or is spelled otherwise is no
// matter.
func findFileMapping(mapsPath string, dev, ino uint64, size int64) (int64, error) {
	wantDev := fmt.Sprintf("%02x:%02x", unix.Major(dev), unix.Minor(dev))
	wantIno := strconv.FormatUint(ino, 10)
	return findMappingWhere(mapsPath, size, fmt.Sprintf("guest memory (inode %d)", ino), func(dev, inode, _ string) bool {
		return dev == wantDev && inode == wantIno
	})
}

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // a file page or shared anonymous: not the guest's own copy
)

// ownPages lists the runs of pages (byte offsets into the mapping) the
// guest holds as its own copies: present and anonymous, or swapped out.
func (p *privateRAM) ownPages() ([][2]int64, error) {
	const page = 4096
	pages := p.size / page
	var runs [][2]int64
	buf := make([]byte, 8*8192)
	for first := int64(0); first < pages; first += 8192 {
		n := min(8192, pages-first)
		b := buf[:8*n]
		if _, err := p.pagemap.ReadAt(b, (p.base/page+first)*8); err != nil {
			return nil, fmt.Errorf("reading QEMU's page map: %w", err)
		}
		for i := int64(0); i < n; i++ {
			e := binary.LittleEndian.Uint64(b[8*i:])
			own := e&pmSwapped != 0 || (e&pmPresent != 0 && e&pmFile == 0)
			if !own {
				continue
			}
			off := (first + i) * page
			if k := len(runs); k > 0 && runs[k-1][1] == off && runs[k-1][1]-runs[k-1][0] < 1<<20 {
				runs[k-1][1] += page
			} else {
				runs = append(runs, [2]int64{off, off + page})
			}
		}
	}
	return runs, nil
}

// refresh makes dst (the capture's "ram") hold the guest's own pages as
// they are now, with the guest stopped: it writes the pages that differ
// (a hole for one that became zero) and returns the bytes written.
func (p *privateRAM) refresh(dst *os.File) (int64, error) {
	runs, err := p.ownPages()
	if err != nil {
		return 0, err
	}
	const page = 4096
	cur := make([]byte, 1<<20)
	old := make([]byte, 1<<20)
	var written int64
	for _, r := range runs {
		n := r[1] - r[0]
		if _, err := p.mem.ReadAt(cur[:n], p.base+r[0]); err != nil {
			return written, fmt.Errorf("reading guest memory in QEMU: %w", err)
		}
		if _, err := dst.ReadAt(old[:n], r[0]); err != nil {
			return written, fmt.Errorf("reading %s: %w", dst.Name(), err)
		}
		for q := int64(0); q < n; q += page {
			c := cur[q : q+page]
			if bytes.Equal(c, old[q:q+page]) {
				continue
			}
			if isZero(c) {
				if err := unix.Fallocate(int(dst.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, r[0]+q, page); err != nil {
					return written, fmt.Errorf("punching a hole in %s: %w", dst.Name(), err)
				}
				continue
			}
			if _, err := dst.WriteAt(c, r[0]+q); err != nil {
				return written, fmt.Errorf("writing %s: %w", dst.Name(), err)
			}
			written += page
		}
	}
	return written, nil
}
