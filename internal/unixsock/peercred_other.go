//go:build !linux

package unixsock

import (
	"errors"
	"net"
	"runtime"
)

// errNoPeerCred is why every client is refused on this platform.
var errNoPeerCred = errors.New("peer credentials are not implemented on " + runtime.GOOS)

// PeerUID fails closed where SO_PEERCRED is not implemented: the socket is
// owner-only by contract, and a server that cannot tell who connected must
// refuse everyone rather than trust the file mode alone. This file exists
// so the package builds on the platforms that import nether's client
// (macOS), not so the server runs there.
func PeerUID(conn *net.UnixConn) (int, error) {
	return -1, errNoPeerCred
}
