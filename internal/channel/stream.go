package channel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Stream is one bidirectional byte stream inside the channel. Reads and
// writes may run concurrently with each other; concurrent writes are
// serialised frame by frame.
type Stream struct {
	m    *Mux
	id   uint32
	meta []byte

	// guarded by m.mu
	credit       int      // bytes we may still send
	reserved     int      // credit a WriteFrom took and has not yet spent
	unread       [][]byte // received payloads, not yet read; the first from unreadOff on
	unreadOff    int
	unreadLen    int // bytes in unread
	consumed     int // read since our last window grant
	localClosed  bool
	remoteClosed bool
	reset        bool
	resetReason  string
	status       []byte
	accepted     bool
}

// ID is the stream's id on the wire.
func (s *Stream) ID() uint32 { return s.id }

// Meta is what the opener sent with the open frame.
func (s *Stream) Meta() []byte { return s.meta }

// Read reads stream bytes; io.EOF after the peer's CloseWrite.
func (s *Stream) Read(p []byte) (int, error) {
	return s.ReadContext(context.Background(), p)
}

// ReadContext is Read that gives up when ctx ends.
func (s *Stream) ReadContext(ctx context.Context, p []byte) (int, error) {
	m := s.m
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			m.mu.Lock()
			m.cond.Broadcast()
			m.mu.Unlock()
		})
		defer stop()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	// While frozen nothing is delivered: a capture in progress must not
	// hand a reader bytes the captured state still holds.
	for (m.frozen && !m.closed && ctx.Err() == nil) ||
		(s.unreadLen == 0 && !s.remoteClosed && !s.reset && !m.closed && ctx.Err() == nil) {
		m.cond.Wait()
	}
	if m.halted {
		return 0, ErrClosed
	}
	if s.unreadLen > 0 && len(p) > 0 {
		n := s.takeLocked(p)
		s.consumedLocked(n)
		return n, nil
	}
	switch {
	case s.reset:
		return 0, fmt.Errorf("%w: %s", ErrReset, s.resetReason)
	case s.unreadLen == 0 && s.remoteClosed:
		m.reapLocked(s)
		return 0, io.EOF
	case m.closed:
		return 0, m.closedErrLocked()
	case ctx.Err() != nil:
		return 0, ctx.Err()
	}
	return 0, nil
}

// consumedLocked accounts for n bytes the reader took.
func (s *Stream) consumedLocked(n int) {
	m := s.m
	s.consumed += n
	// Grant credit back in half-window steps: often enough that the
	// sender never idles on a reader that keeps up, rarely enough that
	// window frames stay a small fraction of the traffic.
	if s.consumed >= Window/2 && !s.remoteClosed && !s.reset {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], uint32(s.consumed))
		s.consumed = 0
		m.sendLocked(typeWindow, s.id, b[:])
	}
	m.reapLocked(s)
}

// BuffersWriter is a writer that takes several buffers in one call (a
// file's writev), which WriteTo prefers: it hands over every payload that
// has arrived at once, with no copy to gather them.
type BuffersWriter interface {
	// WriteBuffers writes the buffers in order and returns how many bytes
	// it wrote; fewer than all of them only with an error.
	WriteBuffers(bufs [][]byte) (int64, error)
}

// WriteTo implements io.WriterTo (so io.Copy uses it): it writes the
// stream's bytes to w as they arrive, each frame's payload as it came,
// with none of the copy a Read makes, until the peer's CloseWrite, when
// it returns nil. Bytes handed to w are consumed, as if Read; an error of
// w's ends it.
func (s *Stream) WriteTo(w io.Writer) (int64, error) {
	m := s.m
	var total int64
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		// While frozen nothing is delivered, as with Read.
		for (m.frozen && !m.closed) || (s.unreadLen == 0 && !s.remoteClosed && !s.reset && !m.closed) {
			m.cond.Wait()
		}
		if m.halted {
			return total, ErrClosed
		}
		if s.unreadLen > 0 {
			held, off, n := s.unread, s.unreadOff, s.unreadLen
			s.unread, s.unreadOff, s.unreadLen = nil, 0, 0
			m.mu.Unlock()
			var werr error
			if bw, ok := w.(BuffersWriter); ok {
				bufs := append(make([][]byte, 0, len(held)), held...)
				bufs[0] = bufs[0][off:]
				k, err := bw.WriteBuffers(bufs)
				total += k
				if err == nil && k < int64(n) {
					err = io.ErrShortWrite
				}
				werr = err
			} else {
				for i, p := range held {
					if i == 0 {
						p = p[off:]
					}
					k, err := w.Write(p)
					total += int64(k)
					if err == nil && k < len(p) {
						err = io.ErrShortWrite
					}
					if err != nil {
						werr = err
						break
					}
				}
			}
			m.mu.Lock()
			for _, p := range held {
				m.payloads.put(p)
			}
			s.consumedLocked(n)
			if werr != nil {
				return total, werr
			}
			continue
		}
		switch {
		case s.reset:
			return total, fmt.Errorf("%w: %s", ErrReset, s.resetReason)
		case s.remoteClosed:
			m.reapLocked(s)
			return total, nil
		default:
			return total, m.closedErrLocked()
		}
	}
}

// takeLocked copies unread bytes into p, as many as fit, and gives the
// buffers it empties back to the pool.
func (s *Stream) takeLocked(p []byte) int {
	n := 0
	for n < len(p) && len(s.unread) > 0 {
		head := s.unread[0]
		k := copy(p[n:], head[s.unreadOff:])
		n += k
		s.unreadOff += k
		if s.unreadOff == len(head) {
			s.m.payloads.put(head)
			s.unread[0] = nil
			s.unread = s.unread[1:]
			s.unreadOff = 0
		}
	}
	if len(s.unread) == 0 {
		s.unread = nil
	}
	s.unreadLen -= n
	return n
}

// unreadBytes is a copy of the unread bytes, in one slice.
func (s *Stream) unreadBytes() []byte {
	if s.unreadLen == 0 {
		return nil
	}
	b := make([]byte, 0, s.unreadLen)
	for i, p := range s.unread {
		if i == 0 {
			p = p[s.unreadOff:]
		}
		b = append(b, p...)
	}
	return b
}

// Write sends p, waiting for credit from the peer as needed.
func (s *Stream) Write(p []byte) (int, error) {
	return s.WriteContext(context.Background(), p)
}

// WriteContext is Write that gives up when ctx ends (for example when the
// peer stopped reading and the caller has a deadline).
func (s *Stream) WriteContext(ctx context.Context, p []byte) (int, error) {
	written := 0
	for written < len(p) {
		// Frames of MaxPayload here, not maxData: a caller writing 32 KiB
		// at a time would otherwise send each write as two frames. And no
		// larger than what is left to write: the frame's buffer is
		// allocated to that size.
		limit := min(MaxPayload, len(p)-written)
		n, err := s.writeFrame(ctx, limit, func(b []byte) (int, error) {
			return copy(b, p[written:]), nil
		})
		written += n
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// maxData is the most payload a data frame carries: MaxPayload bytes in
// all, header included, because a virtio-serial port takes at most 32 KiB
// per write(2) in the guest, and a frame one header longer costs a second
// write (a second buffer and notification for the device) of 36 bytes.
const maxData = MaxPayload - headerLen

// WriteFrom sends one data frame whose payload read writes in place, so
// a caller reading from a file moves each byte into the frame once, with
// no copy in between. It waits (until ctx ends) for credit from the peer,
// calls read once with a buffer as large as the credit and a frame allow,
// and sends the bytes read put there, if any. It returns how many it sent
// and read's error as read returned it, or the stream's own error.
func (s *Stream) WriteFrom(ctx context.Context, read func(p []byte) (int, error)) (int, error) {
	return s.writeFrame(ctx, maxData, read)
}

// writeFrame is WriteFrom with frames of at most limit payload bytes.
func (s *Stream) writeFrame(ctx context.Context, limit int, read func(p []byte) (int, error)) (int, error) {
	m := s.m
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			m.mu.Lock()
			m.cond.Broadcast()
			m.mu.Unlock()
		})
		defer stop()
	}
	m.mu.Lock()
	for s.credit == 0 && !s.reset && !s.localClosed && !m.closed && ctx.Err() == nil {
		m.cond.Wait()
	}
	if err := s.writableLocked(); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		m.mu.Unlock()
		return 0, err
	}
	// The credit is taken now, and what read leaves unused given back:
	// a concurrent writer must not spend it meanwhile. State counts it
	// as unspent while read runs (see reserved).
	n := min(s.credit, limit)
	s.credit -= n
	s.reserved += n
	m.mu.Unlock()

	// A recycled buffer: in a TCG guest a fresh one costs a page fault
	// per page on its first touch, besides the garbage collector's work.
	enc := m.frames.get(headerLen + n)
	k, rerr := read(enc[headerLen:])
	k = max(0, min(k, n))
	enc = enc[:headerLen+k]
	if k > 0 {
		sealPayload(enc)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	s.reserved -= n
	s.credit += n - k
	if k == 0 {
		m.frames.put(enc)
		m.cond.Broadcast() // the credit is back for another writer
		return 0, rerr
	}
	if err := s.writableLocked(); err != nil {
		m.frames.put(enc)
		return 0, err
	}
	m.sendSealedLocked(typeData, s.id, enc)
	return k, rerr
}

// writableLocked is why the stream can take no more bytes, or nil.
func (s *Stream) writableLocked() error {
	switch {
	case s.reset:
		return fmt.Errorf("%w: %s", ErrReset, s.resetReason)
	case s.localClosed:
		return errors.New("write on a stream already closed for writing")
	case s.m.closed:
		return s.m.closedErrLocked()
	}
	return nil
}

// CloseWrite tells the peer no more bytes follow; status travels with it
// (for example a command's exit code).
func (s *Stream) CloseWrite(status []byte) error {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if s.reset {
		return fmt.Errorf("%w: %s", ErrReset, s.resetReason)
	}
	if s.localClosed {
		return nil
	}
	if len(status) > MaxPayload {
		status = status[:MaxPayload]
	}
	s.localClosed = true
	m.sendLocked(typeClose, s.id, status)
	m.reapLocked(s)
	return nil
}

// Reset aborts the stream in both directions.
func (s *Stream) Reset(reason string) {
	m := s.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(reason) > 256 {
		reason = reason[:256]
	}
	m.resetLocked(s, reason)
}

// Status is the payload of the peer's CloseWrite, valid after Read has
// returned io.EOF.
func (s *Stream) Status() []byte {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	return s.status
}
