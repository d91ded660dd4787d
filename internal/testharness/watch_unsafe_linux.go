package testharness

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// inotifyEventAt is the event header at buf[off:], which holds at least
// unix.SizeofInotifyEvent bytes: the kernel writes it in the machine's
// own layout.
func inotifyEventAt(buf []byte, off int) *unix.InotifyEvent {
	return (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
}
