//go:build !linux

package control

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerHungUp reports whether the client at the other end of conn has
// closed its connection with nothing left unread: a zero-byte peek. (There
// is no POLLRDHUP here, so a hang-up behind unread bytes is seen only once
// the reader has consumed them. The server refuses every client on these
// platforms anyway; see peerUID.)
func peerHungUp(conn *net.UnixConn) bool {
	raw, err := conn.SyscallConn()
	if err != nil {
		return true
	}
	closed := false
	if err := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = n == 0 && err == nil
	}); err != nil {
		return true
	}
	return closed
}
