package qemu

import (
	"encoding/binary"
	"errors"
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
	pid          int
	mem, pagemap *os.File
	base, size   int64
	// noScan: the kernel has no PAGEMAP_SCAN (before Linux 6.7), so
	// ownPages reads the page map entry by entry. noVMRead: reads go
	// through /proc/PID/mem, process_vm_readv being refused.
	noScan, noVMRead bool
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
	p := &privateRAM{pid: pid, base: base, size: size}
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

// PAGEMAP_SCAN (include/uapi/linux/fs.h, Linux 6.7): the kernel walks
// the page tables and returns runs of pages by category, where a read of
// /proc/PID/pagemap returns 8 bytes per page (1 MiB for 512 MiB of RAM)
// to be read one by one.
const (
	pageIsFile    = 1 << 2
	pageIsPresent = 1 << 3
	pageIsSwapped = 1 << 4
	// _IOWR('f', 16, struct pm_scan_arg), the argument 96 bytes.
	pagemapScan = 3<<30 | 96<<16 | 'f'<<8 | 16
)

type pmScanArg struct {
	size, flags, start, end, walkEnd, vec, vecLen, maxPages       uint64
	categoryInverted, categoryMask, categoryAnyofMask, returnMask uint64
}

type pageRegion struct{ start, end, categories uint64 }

// ownPages lists the runs of pages (byte offsets into the mapping) the
// guest holds as its own copies: present and anonymous, or swapped out.
// Runs are at most ownRunMax long.
func (p *privateRAM) ownPages() ([][2]int64, error) {
	if !p.noScan {
		runs, err := p.scanOwnPages()
		if !errors.Is(err, unix.ENOTTY) && !errors.Is(err, unix.EINVAL) {
			return runs, err
		}
		p.noScan = true
	}
	return p.readOwnPages()
}

// scanOwnPages is ownPages by PAGEMAP_SCAN: the pages not of the file
// (inverted) that are present or swapped, as readOwnPages counts them.
func (p *privateRAM) scanOwnPages() ([][2]int64, error) {
	regions := make([]pageRegion, 1024)
	arg := newScanArg(regions)
	arg.start, arg.end = uint64(p.base), uint64(p.base+p.size)
	arg.categoryInverted, arg.categoryMask = pageIsFile, pageIsFile
	arg.categoryAnyofMask = pageIsPresent | pageIsSwapped
	arg.returnMask = pageIsPresent | pageIsSwapped
	var runs [][2]int64
	for arg.start < arg.end {
		n, err := pagemapScanInto(p.pagemap.Fd(), &arg, regions)
		if err != nil {
			return nil, fmt.Errorf("scanning QEMU's page map: %w", err)
		}
		for _, r := range regions[:n] {
			for off := int64(r.start) - p.base; off < int64(r.end)-p.base; {
				end := min(off+ownRunMax, int64(r.end)-p.base)
				runs = appendExtent(runs, [2]int64{off, end}, ownRunMax)
				off = end
			}
		}
		if arg.walkEnd <= arg.start {
			return nil, fmt.Errorf("scanning QEMU's page map: the walk stopped at %#x", arg.walkEnd)
		}
		arg.start = arg.walkEnd
	}
	return runs, nil
}

// ownRunMax bounds a run of own pages: refreshRuns compares each in a
// buffer of this size.
const ownRunMax = 1 << 20

// readOwnPages is ownPages by reading /proc/PID/pagemap.
func (p *privateRAM) readOwnPages() ([][2]int64, error) {
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
			runs = appendExtent(runs, [2]int64{off, off + page}, ownRunMax)
		}
	}
	return runs, nil
}

// readRuns reads the runs of the mapping into buf, one after another
// (buf holds them all). process_vm_readv takes up to 1024 runs a call;
// /proc/PID/mem, where it is refused, one run and one page at a time in
// the kernel (several microseconds a page here).
func (p *privateRAM) readRuns(buf []byte, runs [][2]int64) error {
	if !p.noVMRead {
		err := p.vmRead(buf, runs)
		if !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM) {
			return err
		}
		p.noVMRead = true
	}
	at := int64(0)
	for _, r := range runs {
		n := r[1] - r[0]
		if _, err := p.mem.ReadAt(buf[at:at+n], p.base+r[0]); err != nil {
			return fmt.Errorf("reading guest memory in QEMU: %w", err)
		}
		at += n
	}
	return nil
}

func (p *privateRAM) vmRead(buf []byte, runs [][2]int64) error {
	const batch = 1024 // IOV_MAX
	local := make([]unix.Iovec, 0, batch)
	remote := make([]unix.RemoteIovec, 0, batch)
	at := int64(0)
	for len(runs) > 0 {
		k := min(batch, len(runs))
		local, remote = local[:0], remote[:0]
		var want int
		for _, r := range runs[:k] {
			n := r[1] - r[0]
			local = append(local, unix.Iovec{Base: &buf[at], Len: uint64(n)})
			remote = append(remote, unix.RemoteIovec{Base: uintptr(p.base + r[0]), Len: int(n)})
			at += n
			want += int(n)
		}
		got, err := unix.ProcessVMReadv(p.pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("reading guest memory in QEMU: %w", err)
		}
		if got != want {
			// Every page read is the guest's own and mapped: a short
			// read means the mapping changed under us.
			return fmt.Errorf("reading guest memory in QEMU: %d of %d bytes", got, want)
		}
		runs = runs[k:]
	}
	return nil
}

// refreshRuns makes dst (the capture's "ram") hold the guest's own pages
// as they are now: runs is what ownPages listed, the guest stopped since.
// It writes the pages that differ (a hole for one that became zero) and
// returns the bytes written.
func (p *privateRAM) refreshRuns(dst *os.File, runs [][2]int64) (int64, error) {
	var total int64
	for _, r := range runs {
		total += r[1] - r[0]
	}
	all := make([]byte, total)
	if err := p.readRuns(all, runs); err != nil {
		return 0, err
	}
	old := make([]byte, ownRunMax)
	var written int64
	at := int64(0)
	for _, r := range runs {
		n := r[1] - r[0]
		cur := all[at : at+n]
		at += n
		if _, err := dst.ReadAt(old[:n], r[0]); err != nil {
			return written, fmt.Errorf("reading %s: %w", dst.Name(), err)
		}
		w, err := mendPages(dst, r[0], cur, old[:n])
		written += w
		if err != nil {
			return written, err
		}
	}
	return written, nil
}
