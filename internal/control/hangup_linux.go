package control

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerHungUp reports whether the client at the other end of conn has
// closed its connection (or shut down its sending side), whether or not
// the server has read everything it sent: POLLRDHUP is raised the moment
// the peer hangs up, with bytes still unread. That is what makes the seat
// rule deterministic: a client that connects after the primary closed
// finds the primary hung up, however far the primary's reader has got.
func peerHungUp(conn *net.UnixConn) bool {
	raw, err := conn.SyscallConn()
	if err != nil {
		return true
	}
	hung := false
	if err := raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		hung = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	}); err != nil {
		return true // closed under us: gone
	}
	return hung
}
