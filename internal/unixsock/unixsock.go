// Package unixsock is nether's owner-only Unix listeners (the control
// socket, the data socket) and the peer checks on both ends: who
// connected to us, and who serves a socket we dial (the egress socket).
package unixsock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Listener is an owner-only listener bound at a path. Close removes the
// socket file only if it is still the one Listen bound, so a successor
// that took the path over keeps its socket.
type Listener struct {
	*net.UnixListener
	path string
	ino  uint64
}

// Listen binds an owner-only (0600) socket at path; what names the
// socket in errors ("control_socket", "data_socket"). A socket file left
// by a process that died is replaced; one a live process still serves is
// refused, so two sandboxes never fight over one path; anything that is
// not a socket is left alone and refused.
func Listen(path, what string) (*Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s %s exists and is not a socket; refusing to replace it", what, path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%s %s is served by a running process; refusing to take it over", what, path)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("checking the existing %s %s: %w", what, path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale %s %s: %w", what, path, err)
		}
	}
	// Bind with a restrictive umask so the socket is never, even for a
	// moment, connectable by another user.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listening on %s %s: %w", what, path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("chmod %s %s: %w", what, path, err)
	}
	ln.SetUnlinkOnClose(false) // Close unlinks it, only if it is still ours
	l := &Listener{UnixListener: ln, path: path}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		l.ino = st.Ino
	}
	return l, nil
}

// Path is where the listener is bound.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket file if it is still ours.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	l.Unlink()
	return err
}

// Unlink removes the socket file if it is still the one Listen bound.
func (l *Listener) Unlink() {
	var st unix.Stat_t
	if err := unix.Stat(l.path, &st); err == nil && st.Ino == l.ino {
		os.Remove(l.path)
	}
}
