package channel

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// readv reads fd into iovs (never empty), retrying on EINTR.
func readv(fd int, iovs []unix.Iovec) (int, error) {
	for {
		n, _, errno := unix.Syscall(unix.SYS_READV, uintptr(fd), uintptr(unsafe.Pointer(&iovs[0])), uintptr(len(iovs)))
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		}
		return 0, errno
	}
}
