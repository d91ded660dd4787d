package qemu

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// newScanArg is a PAGEMAP_SCAN argument whose results land in regions
// (never empty): the kernel reads its size and writes through its vector.
func newScanArg(regions []pageRegion) pmScanArg {
	return pmScanArg{
		size:   uint64(unsafe.Sizeof(pmScanArg{})),
		vec:    uint64(uintptr(unsafe.Pointer(&regions[0]))),
		vecLen: uint64(len(regions)),
	}
}

// pagemapScanInto runs one PAGEMAP_SCAN of arg (made by newScanArg with
// regions) on the page map fd and returns how many regions it filled.
func pagemapScanInto(fd uintptr, arg *pmScanArg, regions []pageRegion) (int, error) {
	n, _, errno := unix.Syscall(unix.SYS_IOCTL, fd, pagemapScan, uintptr(unsafe.Pointer(arg)))
	runtime.KeepAlive(regions) // the kernel wrote into it through arg.vec
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}
