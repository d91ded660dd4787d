package channel

import (
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// portReader reads a virtio-serial port with readv(2).
//
// The guest's virtio_console driver hands over at most one of its
// page-sized receive buffers per read(2), and has no vectored read of its
// own, so the kernel runs readv as one read per vector for as long as
// each fills its vector: one system call takes every page that is ready.
// Under TCG a system call, and the Go runtime's work around it, cost
// about as much as copying the page; a 64 MiB __put__ made 16384 reads.
// (Writes stay plain: writev to the port, one call per batch of frames,
// showed no gain for __get__, whose frames are 32 KiB writes already.)
type portReader struct {
	rc   syscall.RawConn
	page int
	// iovs is reused: x/sys/unix's Readv builds a new vector array per
	// call, which showed in the guest's profile.
	iovs []unix.Iovec
}

// maxIovecs bounds the vectors of a call: IOV_MAX.
const maxIovecs = 1024

// newPortReader returns a portReader for rw when it is a character device
// (the guest's port); nil otherwise (a host socket, a pipe in a test),
// which plain reads serve.
func newPortReader(rw io.ReadWriter) *portReader {
	f, ok := rw.(*os.File)
	if !ok {
		return nil
	}
	fi, err := f.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil
	}
	return &portReader{rc: rc, page: os.Getpagesize()}
}

// Read fills p with as many of the port's buffers as are ready, one page
// per vector.
func (p *portReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	p.iovs = p.iovs[:0]
	for len(b) > 0 && len(p.iovs) < maxIovecs {
		k := min(len(b), p.page)
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(k)
		p.iovs = append(p.iovs, v)
		b = b[k:]
	}
	var n int
	var err error
	if rerr := p.rc.Read(func(fd uintptr) bool {
		n, err = readv(int(fd), p.iovs)
		return err != unix.EAGAIN
	}); rerr != nil {
		return 0, rerr
	}
	switch {
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF // no host on the other end right now
	}
	return n, nil
}
