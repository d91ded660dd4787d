package store

import (
	"errors"
	"syscall"
)

// processAlive says whether pid names a live process (one we may not
// signal, EPERM, is alive too).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
