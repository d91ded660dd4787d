package main

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// setThreadGroups sets the calling thread's supplementary groups (groups
// is never empty). The raw system call is the point: it changes only this
// thread, where the syscall package's Setgroups changes every thread of
// the process.
func setThreadGroups(groups []uint32) error {
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(groups)), uintptr(unsafe.Pointer(&groups[0])), 0); e != 0 {
		return fmt.Errorf("setgroups: %w", e)
	}
	return nil
}
