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
	credit       int    // bytes we may still send
	unread       []byte // received, not yet read
	consumed     int    // read since our last window grant
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
		(len(s.unread) == 0 && !s.remoteClosed && !s.reset && !m.closed && ctx.Err() == nil) {
		m.cond.Wait()
	}
	if m.halted {
		return 0, ErrClosed
	}
	if len(s.unread) > 0 && len(p) > 0 {
		n := copy(p, s.unread)
		s.unread = s.unread[n:]
		if len(s.unread) == 0 {
			s.unread = nil
		}
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
		return n, nil
	}
	switch {
	case s.reset:
		return 0, fmt.Errorf("%w: %s", ErrReset, s.resetReason)
	case len(s.unread) == 0 && s.remoteClosed:
		m.reapLocked(s)
		return 0, io.EOF
	case m.closed:
		return 0, m.closedErrLocked()
	case ctx.Err() != nil:
		return 0, ctx.Err()
	}
	return 0, nil
}

// Write sends p, waiting for credit from the peer as needed.
func (s *Stream) Write(p []byte) (int, error) {
	return s.WriteContext(context.Background(), p)
}

// WriteContext is Write that gives up when ctx ends (for example when the
// peer stopped reading and the caller has a deadline).
func (s *Stream) WriteContext(ctx context.Context, p []byte) (int, error) {
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
	written := 0
	for written < len(p) {
		for s.credit == 0 && !s.reset && !s.localClosed && !m.closed && ctx.Err() == nil {
			m.cond.Wait()
		}
		switch {
		case s.reset:
			return written, fmt.Errorf("%w: %s", ErrReset, s.resetReason)
		case s.localClosed:
			return written, errors.New("write on a stream already closed for writing")
		case m.closed:
			return written, m.closedErrLocked()
		case ctx.Err() != nil:
			return written, ctx.Err()
		}
		n := min(len(p)-written, s.credit, MaxPayload)
		chunk := append([]byte(nil), p[written:written+n]...)
		m.sendLocked(typeData, s.id, chunk)
		s.credit -= n
		written += n
	}
	return written, nil
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
