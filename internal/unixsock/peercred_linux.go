package unixsock

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// PeerUID returns the uid of the process at the other end of conn, as the
// kernel recorded it at connect time (SO_PEERCRED), so a client cannot
// claim another identity.
func PeerUID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var cerr error
	err = raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil {
		return -1, fmt.Errorf("peer credentials: %w", err)
	}
	if cerr != nil {
		return -1, fmt.Errorf("peer credentials: SO_PEERCRED: %w", cerr)
	}
	return int(cred.Uid), nil
}
