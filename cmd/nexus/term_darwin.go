package main

import (
	"os"

	"golang.org/x/sys/unix"
)

// isTerminal on darwin asks with TIOCGETA, its name for TCGETS.
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TIOCGETA)
	return err == nil
}
