package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// File transfers. However a transfer's stream ends (done, refused, over
// the host's limit, reset by the host, or the channel closed) the serving
// goroutine returns and every descriptor it opened is closed, and a put
// leaves no temporary file behind.

// guestPath resolves a transfer path, byte for byte: an absolute path is
// used exactly as sent, a relative one is taken relative to /root (the
// directory commands run in) by prefixing "/root/". Nothing is cleaned:
// "a//b" and "a/../b" reach the kernel as sent and resolve as they would
// for a command in the guest (".." after a symlink to a directory is that
// directory's parent, which lexical cleaning gets wrong). Symlinks are
// followed, as by a command. An empty path, and one holding a NUL byte
// (which no system call can take), are refused.
func guestPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("empty guest path")
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("%s: guest path holds a NUL byte", showPath(p))
	}
	if p[0] != '/' {
		p = "/root/" + p
	}
	return p, nil
}

// showPath is a path as messages show it: as it is when it is printable
// UTF-8, quoted otherwise, so no byte of it can garble the host's output.
func showPath(p string) string {
	for _, r := range p {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(p)
		}
	}
	return p
}

// transferLimit checks a request's Max: 0 is no limit.
func transferLimit(req agentproto.Request) (int64, error) {
	if req.Max < 0 {
		return 0, fmt.Errorf("invalid transfer limit %d", req.Max)
	}
	return req.Max, nil
}

func overLimit(path string, max int64) error {
	return fmt.Errorf("%s: more than %d bytes, over the transfer limit of %d", showPath(path), max, max)
}

// transferTarget reads a transfer's guest path and limit, resetting the
// stream when either is unusable.
func transferTarget(s *channel.Stream, req agentproto.Request) (path string, max int64, ok bool) {
	path, err := guestPath(string(req.Path))
	if err == nil {
		max, err = transferLimit(req)
	}
	if err != nil {
		s.Reset(err.Error())
		return "", 0, false
	}
	return path, max, true
}

// put writes the stream's bytes to a temporary file beside the target and
// renames it into place only when the host's declared length matches, so
// an interrupted transfer never leaves a half-written file under the
// target's name.
//
// Only a regular file, or nothing, is replaced: renaming over a device, a
// FIFO, a socket or a directory would replace it (a put onto /dev/null
// used to leave a regular file there, which every later `>/dev/null`
// appended to). The target is looked at through symlinks; a symlink to a
// regular file, or a dangling one, is itself replaced by the new file.
func (a *agent) put(s *channel.Stream, req agentproto.Request) {
	path, max, ok := transferTarget(s, req)
	if !ok {
		return
	}
	// The temporary file goes in the target's own directory, as named:
	// the rename must not cross file systems, and cleaning the name could
	// pick another directory.
	i := strings.LastIndexByte(path, '/')
	dir, name := path[:i+1], path[i+1:]
	if name == "" || name == "." || name == ".." {
		s.Reset(fmt.Sprintf("%s: names a directory, not a file", showPath(path)))
		return
	}
	mode := os.FileMode(req.Mode & 0o7777)
	if mode == 0 {
		mode = 0o644
	}
	// The names are resolved, and the file created, with the run_as
	// user's credentials: a put reaches what the user's commands reach,
	// and the file is the user's.
	user := a.policy.get()
	var tmp *os.File
	err := asUser(user, func() error {
		if err := replaceable(path); err != nil {
			return err
		}
		var err error
		if tmp, err = os.CreateTemp(dir, ".nether-put-*"); err != nil {
			return fmt.Errorf("creating %s: %v", showPath(path), unwrapPathError(err))
		}
		return nil
	})
	if err != nil {
		s.Reset(err.Error())
		return
	}
	renamed := false
	defer func() {
		tmp.Close() // a second Close after the explicit one only errs
		if !renamed {
			os.Remove(tmp.Name())
		}
	}()
	n, err := receive(tmp, s, path, max)
	if err != nil {
		s.Reset(err.Error()) // no-op when the host reset the stream
		return
	}
	want, err := strconv.ParseInt(string(s.Status()), 10, 64)
	if err != nil || want != n {
		s.Reset(fmt.Sprintf("transfer of %s incomplete: got %d bytes, host declared %q", showPath(path), n, s.Status()))
		return
	}
	if err := tmp.Chmod(mode); err != nil {
		s.Reset(fmt.Sprintf("setting mode of %s: %v", showPath(path), unwrapPathError(err)))
		return
	}
	if err := tmp.Sync(); err != nil {
		s.Reset(fmt.Sprintf("writing %s: %v", showPath(path), unwrapPathError(err)))
		return
	}
	if err := tmp.Close(); err != nil {
		s.Reset(fmt.Sprintf("writing %s: %v", showPath(path), unwrapPathError(err)))
		return
	}
	// Again, now that the bytes are in: something may have appeared
	// under the name while they arrived.
	err = asUser(user, func() error {
		if err := replaceable(path); err != nil {
			return err
		}
		if err := os.Rename(tmp.Name(), path); err != nil {
			return fmt.Errorf("renaming into %s: %v", showPath(path), unwrapPathError(err))
		}
		return nil
	})
	if err != nil {
		s.Reset(err.Error())
		return
	}
	renamed = true
	s.CloseWrite(agentproto.OKStatus(n))
}

// replaceable refuses a put target that exists and is not a regular file.
func replaceable(path string) error {
	if fi, err := os.Stat(path); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("%s: not a regular file; refusing to replace it", showPath(path))
	}
	return nil
}

// receive copies the stream into dst until the host's CloseWrite. A reset,
// a closed channel or more than max bytes (when max > 0) end it with an
// error.
//
// The payloads go to the file as they arrived, each batch of them in one
// writev (fileSink.WriteBuffers): no copy to gather them, and few system
// calls. (One write per payload cost a 64 MiB put 0.15-0.45 s more in a
// TCG guest than whole 256 KiB writes gathered by a copy; a writev of
// everything that has arrived costs neither.)
func receive(dst *os.File, s *channel.Stream, path string, max int64) (int64, error) {
	w := &fileSink{f: dst, path: path, max: max}
	_, err := s.WriteTo(w)
	switch {
	case w.err != nil:
		return w.n, w.err
	case err != nil:
		return w.n, fmt.Errorf("receiving %s: %v", showPath(path), err)
	}
	return w.n, nil
}

// fileSink writes a put's bytes to its file, refusing any past max (when
// max > 0), and keeps the error that ended it.
type fileSink struct {
	f    *os.File
	path string
	max  int64
	n    int64
	err  error
}

func (w *fileSink) Write(p []byte) (int, error) {
	k, err := w.WriteBuffers([][]byte{p})
	return int(k), err
}

// iovMax is the most buffers one writev takes (Linux's IOV_MAX).
const iovMax = 1024

// WriteBuffers implements channel.BuffersWriter.
func (w *fileSink) WriteBuffers(bufs [][]byte) (int64, error) {
	var size int64
	for _, b := range bufs {
		size += int64(len(b))
	}
	if w.max > 0 && w.n+size > w.max {
		w.err = overLimit(w.path, w.max)
		return 0, w.err
	}
	var written int64
	for len(bufs) > 0 {
		chunk := bufs[:min(len(bufs), iovMax)]
		k, err := unix.Writev(int(w.f.Fd()), chunk)
		if err == unix.EINTR {
			continue
		}
		if err == nil && k == 0 {
			err = io.ErrShortWrite // a regular file never takes nothing
		}
		if err != nil {
			w.err = fmt.Errorf("writing %s: %v", showPath(w.path), err)
			return written, w.err
		}
		written += int64(k)
		w.n += int64(k)
		// Drop what was written; a short write leaves the rest of a buffer.
		for k > 0 {
			if k >= len(bufs[0]) {
				k -= len(bufs[0])
				bufs = bufs[1:]
				continue
			}
			bufs[0] = bufs[0][k:]
			k = 0
		}
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return written, nil
}

// get sends a regular file's bytes. Anything else is refused before it is
// opened: reading a FIFO, a device or a socket may block, never end or act
// (a tape rewinds, a terminal becomes the agent's).
//
// A regular file can still have nothing to give for ever (/proc/kmsg), so
// it is read without blocking, and while it has nothing the agent looks
// at the stream every pollInterval: a reset or a closed channel ends the
// get. (A file whose read blocks in the kernel despite O_NONBLOCK, such as
// one on a hung network file system, cannot be interrupted this way.)
func (a *agent) get(s *channel.Stream, req agentproto.Request) {
	path, max, ok := transferTarget(s, req)
	if !ok {
		return
	}
	open := a.openSource
	if open == nil {
		open = openSource
	}
	var (
		fd   int
		size int64
	)
	// Opened with the run_as user's credentials: a get reads only what
	// the user's commands could read.
	err := asUser(a.policy.get(), func() (err error) {
		fd, size, err = open(path)
		return err
	})
	if err != nil {
		s.Reset(err.Error())
		return
	}
	defer unix.Close(fd)
	if max > 0 && size > max {
		s.Reset(fmt.Sprintf("%s: %d bytes, over the transfer limit of %d", showPath(path), size, max))
		return
	}
	n, err := a.sendFile(s, fd, path, max)
	if err != nil {
		s.Reset(err.Error()) // no-op when the host reset the stream
		return
	}
	s.CloseWrite(agentproto.OKStatus(n))
}

// openSource opens a get's source for non-blocking reads if it is a
// regular file, and returns its descriptor and size. It looks before it
// opens, since opening a FIFO waits for a writer and opening a device can
// act; it opens with O_NONBLOCK and looks again, in case the name was
// replaced in between.
func openSource(path string) (int, int64, error) {
	notRegular := fmt.Errorf("%s: not a regular file", showPath(path))
	var st unix.Stat_t
	if err := ignoringEINTR(func() error { return unix.Stat(path, &st) }); err != nil {
		return -1, 0, fmt.Errorf("opening %s: %v", showPath(path), err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return -1, 0, notRegular
	}
	var fd int
	err := ignoringEINTR(func() (err error) {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return -1, 0, fmt.Errorf("opening %s: %v", showPath(path), err)
	}
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, notRegular
	}
	return fd, st.Size, nil
}

func ignoringEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// pollInterval is how long a get whose file has nothing to read goes
// without looking at its stream.
const pollInterval = 100 * time.Millisecond

// sendFile copies the non-blocking fd into the stream until end of file.
// With max > 0 it reads at most one byte past max, which is enough to know
// the file is over it.
func (a *agent) sendFile(s *channel.Stream, fd int, path string, max int64) (int64, error) {
	var n int64
	idle := 0 // reads in a row that found nothing
	for {
		// Each read goes straight into the payload of the frame that
		// carries it. WriteFrom waits for the host to take the bytes, and
		// gives up when it resets the stream or the channel closes.
		var rerr error
		over := false
		r, err := s.WriteFrom(context.Background(), func(p []byte) (int, error) {
			if max > 0 && max-n < int64(len(p)) {
				p = p[:max-n+1]
			}
			k, err := readFile(fd, p)
			if max > 0 && n+int64(k) > max {
				over = true
				return 0, nil // none of it goes
			}
			rerr = err
			return k, err
		})
		n += int64(r)
		switch {
		case over:
			return n, overLimit(path, max)
		case err != rerr:
			return n, err // the stream's error, not the file's
		case err == unix.EAGAIN:
			if err := a.streamEnded(s); err != nil {
				return n, err
			}
			idle++
			if idle > 1 {
				// poll said there was something, but there was not:
				// the file cannot be polled. Back off instead of spinning.
				time.Sleep(min(time.Duration(idle)*10*time.Millisecond, pollInterval))
			}
			unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(pollInterval/time.Millisecond))
			continue
		case err != nil:
			return n, fmt.Errorf("reading %s: %v", showPath(path), err)
		case r == 0:
			return n, nil
		}
		idle = 0
	}
}

// readFile is read(2) on fd, again after EINTR; it never returns a
// negative count.
func readFile(fd int, p []byte) (int, error) {
	for {
		k, err := unix.Read(fd, p)
		if err == unix.EINTR {
			continue
		}
		if k < 0 {
			k = 0
		}
		return k, err
	}
}

// done is a context that has ended: reading with it never waits.
var done = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// streamEnded tells, without waiting, whether the host reset the stream or
// the channel closed. A get cannot learn it by reading the stream, which
// is at end of file as soon as the host has sent its request.
func (a *agent) streamEnded(s *channel.Stream) error {
	select {
	case <-a.gone:
		return channel.ErrClosed
	default:
	}
	_, err := s.ReadContext(done, nil)
	if errors.Is(err, channel.ErrReset) || errors.Is(err, channel.ErrClosed) {
		return err
	}
	return nil
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
