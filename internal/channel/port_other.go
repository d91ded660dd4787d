//go:build !linux

package channel

import "io"

// portReader is Linux's vectored reading of a virtio-serial port
// (port_linux.go); elsewhere plain reads serve every transport.
type portReader struct{ io.Reader }

func newPortReader(io.ReadWriter) *portReader { return nil }
