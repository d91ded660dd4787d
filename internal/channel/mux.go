package channel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
)

// Role says which half of the channel a Mux is. The host opens odd stream
// ids and the guest even ones, so the two never collide without a
// negotiation.
type Role uint8

const (
	Host  Role = 1
	Guest Role = 2
)

var (
	// ErrClosed is returned once the Mux is closed.
	ErrClosed = errors.New("channel closed")
	// ErrReset is returned by a stream the peer (or we) aborted.
	ErrReset = errors.New("stream reset")
)

// Mux is one half of the channel.
type Mux struct {
	log  *slog.Logger
	role Role

	mu   sync.Mutex
	cond *sync.Cond

	nextSeq uint64 // seq of the next sequenced frame we send
	recvSeq uint64 // highest peer seq received in order
	ackSent uint64 // highest recvSeq we have put on the wire
	// A frame of our own carries the ack for free; a frame only to
	// acknowledge goes after ackFrames frames, or ackDelay after the
	// first unacknowledged one (ackTimer), or at once when ackNow says
	// (a peer resending what we have must learn that we do).
	ackTimer *time.Timer
	ackArmed bool
	ackNow   bool
	unacked  []*pending
	outq     []*pending // frames for the write loop, in order
	nextID   uint32
	streams  map[uint32]*Stream
	acceptq  []*Stream

	transport io.Writer  // nil while there is no usable transport
	lane      *laneState // nil without a bulk lane (SetLane)
	gen       int        // bumped on each Attach; stale readers and writers stop
	down      bool       // persistent transport failed a write; resend on next frame
	frozen    bool
	closed    bool
	halted    bool  // closed by Halt: even buffered bytes are no longer delivered
	closeErr  error // why the Mux closed, when it was not Close

	payloads payloadPool // received payloads, between the read loop and Stream.Read
	frames   payloadPool // sent frames, between WriteFrom and the end of their last write

	// Loss recovery and liveness (recover.go).
	askedAt  time.Time // when we last asked the peer to send again
	heard    time.Time // when a frame last arrived, or the silence clock restarted
	ackedAt  time.Time // when the resend queue last shrank, or began to fill
	resentAt time.Time // when we last resent our frames unasked
	pingSeq  uint64    // our keepalive still unacknowledged, 0 if none
	dead     chan struct{}

	// counters for meters and logs
	bytesIn, bytesOut uint64
	skipped           uint64
	lastWarn          time.Time
}

// pending is an encoded frame on its way out: in the resend queue until
// acknowledged (if sequenced), in the write queue until written. Its
// buffer goes back to the pool once neither holds it, and never sooner:
// a frame in flight must not change under the write loop.
type pending struct {
	seq  uint64 // 0 for unsequenced frames
	enc  []byte
	refs int  // the resend queue, the write queue or the write loop's batch
	ping bool // a keepalive (recover.go): carries nothing
}

// releaseLocked drops one hold on p.
func (m *Mux) releaseLocked(p *pending) {
	p.refs--
	if p.refs == 0 {
		m.frames.put(p.enc)
		p.enc = nil
	}
}

// setOutqLocked replaces the write queue, releasing what it held.
func (m *Mux) setOutqLocked(q []*pending) {
	for _, p := range m.outq {
		m.releaseLocked(p)
	}
	m.outq = q
}

// New returns an unattached Mux. Frames queue until Attach.
func New(role Role, log *slog.Logger) *Mux {
	m := &Mux{log: log, role: role, nextSeq: 1, streams: map[uint32]*Stream{}, dead: make(chan struct{})}
	if role == Host {
		m.nextID = 1
	} else {
		m.nextID = 2
	}
	m.cond = sync.NewCond(&m.mu)
	m.ackTimer = time.AfterFunc(time.Hour, m.ackTimerFired)
	m.ackTimer.Stop()
	go m.writeLoop()
	return m
}

// Attach hands the Mux a transport. The host calls it for every QEMU
// connection (a restored or forked process is a new connection); the guest
// calls it once for its port with persistent=true, because a virtio-serial
// port reads end-of-file while no host is connected and then carries on.
//
// On attach the host sends a resync request and resends every frame the
// peer has not acknowledged; the peer answers by resending its own.
func (m *Mux) Attach(rw io.ReadWriter, persistent bool) {
	m.mu.Lock()
	m.gen++
	gen := m.gen
	m.transport = rw
	m.down = false
	m.restartSilenceLocked()
	if m.role == Host {
		q := []*pending{{enc: appendFrame(nil, &frame{typ: typeResync}), refs: 1}}
		if m.lane != nil && !m.lane.rxDead.Load() {
			q = append(q, laneAnnounce())
		}
		m.setOutqLocked(append(q, m.resendLocked()...))
	}
	m.cond.Broadcast()
	m.mu.Unlock()
	var r io.Reader = rw
	if port := newPortReader(rw); port != nil {
		r = port
	}
	go m.readLoop(r, gen, persistent)
}

// resendLocked is a write queue of every unacknowledged frame.
func (m *Mux) resendLocked() []*pending {
	q := make([]*pending, 0, len(m.unacked))
	for _, p := range m.unacked {
		p.refs++
		q = append(q, p)
	}
	return q
}

func (m *Mux) readLoop(r io.Reader, gen int, persistent bool) {
	d := Decoder{alloc: m.payloads.get}
	lane := m.lane // set before Attach, never changed
	var frames []*frame
	var scratch []byte // a batch copied out of the lane
	for {
		n, err := d.readFrom(r)
		if n > 0 {
			// Checksums are verified outside the lock: writers and
			// readers of streams go on meanwhile.
			frames = frames[:0]
			var batches, batchBytes, refused uint64
			for {
				f, ferr := d.next()
				if ferr != nil {
					break
				}
				if f.typ == typeBulk && len(f.payload) == laneDescLen && lane != nil {
					// The descriptor stands for the frames it names, in
					// its place in the stream; its ack still counts.
					frames = append(frames, &frame{typ: typeAck, ack: f.ack})
					var ok bool
					if frames, ok = lane.batch(f.payload, &scratch, m.payloads.get, frames); ok {
						batches++
						batchBytes += uint64(binary.LittleEndian.Uint32(f.payload[4:]))
					} else {
						refused++
					}
					continue
				}
				frames = append(frames, f)
			}
			m.mu.Lock()
			if m.gen != gen || m.closed {
				m.mu.Unlock()
				return
			}
			if len(frames) > 0 || refused > 0 {
				m.heard = time.Now()
			}
			if lane != nil {
				lane.batchesIn += batches
				lane.bytesIn += batchBytes
				lane.refused += refused
				if refused != 0 {
					m.warnLocked("channel: refused bulk lane descriptors (out of bounds, or naming bytes that are not their batch)", "refused_total", lane.refused)
					// The frames they stood for are lost: asked for again,
					// through the transport, at once.
					first := !lane.rxDead.Swap(true)
					m.askResendLocked("bulk lane batches were refused", first)
				}
			}
			for _, f := range frames {
				m.handleLocked(f)
			}
			clear(frames) // drop the references until the next read
			if d.Skipped != 0 {
				m.skipped += d.Skipped
				m.warnLocked("channel: skipped bytes that were not valid frames", "bytes_total", m.skipped)
				d.Skipped = 0
				m.askResendLocked("bytes that were not valid frames were skipped", false)
			}
			m.cond.Broadcast()
			m.mu.Unlock()
		}
		if err != nil {
			if persistent && (err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF)) {
				// No host on the other end of the port right now.
				time.Sleep(20 * time.Millisecond)
				continue
			}
			m.mu.Lock()
			if m.gen == gen {
				m.transport = nil
				if !m.closed && m.role == Host {
					// The engine's end of the port is gone for good: a
					// host half is attached once per engine process, so
					// every stream on it fails now instead of waiting
					// forever for a peer that cannot answer. (A restored
					// host half is a new Mux with a new transport.)
					m.closed = true
					m.closeErr = fmt.Errorf("%w: the guest's end of the channel is gone (%v)", ErrClosed, err)
				}
				m.cond.Broadcast()
			}
			closed := m.closed
			m.mu.Unlock()
			if !closed && !errors.Is(err, net.ErrClosed) && err != io.EOF {
				m.log.Debug("channel: transport read ended", "err", err)
			}
			return
		}
	}
}

func (m *Mux) handleLocked(f *frame) {
	// Acknowledgements first: they only ever shrink the resend queue.
	if f.ack >= m.nextSeq {
		f.ack = m.nextSeq - 1 // a peer cannot acknowledge what we never sent
	}
	i := 0
	for i < len(m.unacked) && m.unacked[i].seq <= f.ack {
		i++
	}
	if i > 0 {
		for _, p := range m.unacked[:i] {
			m.releaseLocked(p)
		}
		m.unacked = append(m.unacked[:0:0], m.unacked[i:]...)
		m.ackedAt = time.Now()
	}
	if m.pingSeq != 0 && f.ack >= m.pingSeq {
		m.pingSeq = 0
	}
	if m.lane != nil {
		m.lane.ackLocked(f.ack)
	}
	if m.down {
		// The transport works again: whatever a failed write lost goes again.
		m.down = false
		m.setOutqLocked(m.resendLocked())
	}
	switch {
	case f.typ == typeAck:
		return
	case f.typ == typeResync:
		q := m.resendLocked()
		if m.lane != nil {
			// A new transport may mean a new peer: it says again whether
			// it reads our half (its announce follows its resync). We say
			// so again too, unless we refused a batch of its.
			m.lane.peer = false
			if !m.lane.rxDead.Load() {
				q = append([]*pending{laneAnnounce()}, q...)
			}
		}
		m.setOutqLocked(q)
		return
	case f.typ == typeBulk:
		if len(f.payload) == 0 && m.lane != nil && !m.lane.dead {
			m.lane.peer = true
		}
		return
	case f.typ == typePad:
		return
	case f.seq <= m.recvSeq:
		// A resent frame we already have: our ack covers it, and the
		// peer learns so now rather than after ackDelay.
		m.ackNow = true
		return
	case f.seq != m.recvSeq+1:
		// A gap: frames before it were lost, with an old transport (the
		// resync of the new one has them resent) or on this one (a
		// refused batch, bytes skipped): the peer is asked for them.
		m.askResendLocked("frames arrived after a gap", false)
		return
	}
	m.recvSeq = f.seq
	if !m.ackArmed {
		m.ackArmed = true
		m.ackTimer.Reset(ackDelay)
	}
	m.bytesIn += uint64(len(f.payload))
	s := m.streams[f.stream]
	switch f.typ {
	case typeOpen:
		if len(m.unacked)+len(m.acceptq) >= maxUnacked {
			// A peer that opens streams but never acknowledges what we
			// send would grow our resend queue without bound (every open
			// we refuse costs a reset frame). Ignore its opens until it
			// acknowledges again; a working peer never gets near this.
			m.warnLocked("channel: peer is not acknowledging; ignoring the streams it opens", "unacked_frames", len(m.unacked))
			return
		}
		if s != nil || f.stream == 0 || (f.stream%2 == 1) != (m.role == Guest) {
			m.warnLocked("channel: peer opened an invalid stream id; resetting it", "stream", f.stream)
			m.sendLocked(typeReset, f.stream, []byte("invalid stream id"))
			return
		}
		s = m.newStreamLocked(f.stream, f.payload)
		s.accepted = false
		m.acceptq = append(m.acceptq, s)
	case typeData:
		if s == nil || s.reset || s.remoteClosed {
			return
		}
		if s.unreadLen+len(f.payload) > Window {
			m.warnLocked("channel: peer overran its credit window; resetting stream", "stream", f.stream)
			m.resetLocked(s, "credit window exceeded")
			return
		}
		if len(f.payload) > 0 {
			s.unread = append(s.unread, f.payload)
			s.unreadLen += len(f.payload)
		}
	case typeClose:
		if s == nil || s.reset {
			return
		}
		s.remoteClosed = true
		s.status = f.payload
		m.reapLocked(s)
	case typeReset:
		if s == nil {
			return
		}
		s.reset = true
		s.resetReason = string(f.payload)
		delete(m.streams, s.id)
	case typeWindow:
		if s == nil || len(f.payload) != 4 {
			return
		}
		grant := int(binary.LittleEndian.Uint32(f.payload))
		if s.credit+grant > Window {
			grant = Window - s.credit // never more than one window outstanding
		}
		s.credit += grant
	}
}

// payloadPool recycles the buffers of full-size payloads between the read
// loop, which fills them, and Stream.Read, which empties them: at the
// channel's full rate every payload would otherwise be a fresh allocation
// for the garbage collector, which in a TCG guest costs more than the copy.
type payloadPool struct {
	mu   sync.Mutex
	free [][]byte
}

const (
	// pooledMin is the smallest payload whose buffer is pooled; smaller
	// ones are allocated to size.
	pooledMin = 4 << 10
	// poolMax bounds the idle buffers a pool keeps (1.5 MiB): enough for
	// the payloads of a bulk lane batch (up to 1 MiB), which a writer
	// taking several buffers (BuffersWriter) hands back at once, and for
	// the frames a window grant or an ack frees; not a window's worth
	// held for ever after a transfer. With 16 a 64 MiB put allocated (and
	// the guest zeroed) half its payload buffers afresh.
	poolMax = 48
)

func (p *payloadPool) get(n int) []byte {
	if n < pooledMin || n > MaxPayload {
		return make([]byte, n)
	}
	p.mu.Lock()
	if k := len(p.free); k > 0 {
		b := p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		p.mu.Unlock()
		return b[:n]
	}
	p.mu.Unlock()
	return make([]byte, n, MaxPayload)
}

// put takes back a buffer get returned, once nothing refers to it.
func (p *payloadPool) put(b []byte) {
	if cap(b) != MaxPayload {
		return
	}
	p.mu.Lock()
	if len(p.free) < poolMax {
		p.free = append(p.free, b[:0])
	}
	p.mu.Unlock()
}

// Standalone acknowledgements are batched: in a TCG guest every frame
// written costs a write(2) and a notification of the device, and every
// frame read an interrupt, so an ack per data frame was a tenth of the
// frames on the wire and more of the guest's time. The peer never waits
// for an ack to send (credit comes back in window frames, which carry
// the ack too); acks only let it drop frames from its resend queue, and
// let a snapshot gate see the channel settled, which ackDelay keeps
// prompt.
const (
	ackFrames = 32
	ackDelay  = 2 * time.Millisecond
)

// ackDueLocked says whether a frame only to acknowledge should go now.
func (m *Mux) ackDueLocked() bool {
	return m.ackNow || m.recvSeq-m.ackSent >= ackFrames
}

// ackTimerFired makes the pending acknowledgement due.
func (m *Mux) ackTimerFired() {
	m.mu.Lock()
	if m.ackArmed {
		m.ackArmed = false
		if m.recvSeq != m.ackSent {
			m.ackNow = true
			m.cond.Broadcast()
		}
	}
	m.mu.Unlock()
}

// maxUnacked bounds the resend queue against a peer that opens streams
// without acknowledging anything. Credit windows already bound data.
const maxUnacked = 4096

// warnLocked logs a warning about the peer at most once a second: a
// hostile guest must not be able to flood nether's log.
func (m *Mux) warnLocked(msg string, args ...any) {
	if now := time.Now(); now.Sub(m.lastWarn) >= time.Second {
		m.lastWarn = now
		m.log.Warn(msg, args...)
	}
}

// sendLocked queues a sequenced frame.
func (m *Mux) sendLocked(typ byte, stream uint32, payload []byte) {
	enc := make([]byte, headerLen+len(payload))
	copy(enc[headerLen:], payload)
	sealPayload(enc)
	m.sendSealedLocked(typ, stream, enc)
}

// sendSealedLocked numbers and queues a sequenced frame whose payload is
// already in place and sealed (see sealPayload).
func (m *Mux) sendSealedLocked(typ byte, stream uint32, enc []byte) {
	seq := m.nextSeq
	m.nextSeq++
	putHeader(enc, typ, stream, seq, m.recvSeq)
	p := &pending{seq: seq, enc: enc, refs: 2}
	if len(m.unacked) == 0 {
		m.ackedAt = time.Now() // the wait for an ack starts now
	}
	m.unacked = append(m.unacked, p)
	m.outq = append(m.outq, p)
	m.bytesOut += uint64(len(enc) - headerLen)
	m.cond.Broadcast()
}

func (m *Mux) writeLoop() {
	var bufs net.Buffers
	var runs []laneRun
	for {
		m.mu.Lock()
		for !m.closed && (m.transport == nil || m.down || m.frozen || (len(m.outq) == 0 && !m.ackDueLocked())) {
			m.cond.Wait()
		}
		if m.closed {
			m.mu.Unlock()
			return
		}
		// The batch takes over the write queue's holds on its frames.
		batch := m.outq
		m.outq = nil
		if len(batch) == 0 {
			batch = []*pending{{enc: appendFrame(nil, &frame{typ: typeAck}), refs: 1}}
		}
		// Buffers in the resend queue are rewritten only here, and this
		// goroutine is the only writer, so writing them outside the lock is
		// safe.
		for _, p := range batch {
			setAck(p.enc, m.recvSeq)
		}
		runs = m.planLaneLocked(batch, runs[:0])
		ack := m.recvSeq
		m.ackSent, m.ackNow = m.recvSeq, false
		if m.ackArmed {
			m.ackArmed = false
			m.ackTimer.Stop()
		}
		w, gen := m.transport, m.gen
		m.mu.Unlock()

		bufs = m.laneWrite(batch, runs, ack, bufs[:0])
		wb := bufs // WriteTo consumes its receiver
		_, err := wb.WriteTo(w)
		clear(bufs)
		m.mu.Lock()
		for _, p := range batch {
			m.releaseLocked(p)
		}
		if err != nil && m.gen == gen && !m.closed {
			m.down = true
			m.log.Debug("channel: transport write failed; waiting for the peer", "err", err)
		}
		m.mu.Unlock()
		if err != nil {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// Pad sends at least n bytes of filler through the transport (never the
// bulk lane), which the peer reads and discards. A virtio-serial port's
// receive buffers are guest pages reused in turn, and each keeps the
// bytes of what it last carried until the port fills it again: filler of
// more than the port's buffers overwrites every one (a frame that carried
// secrets, say, before the guest's memory is captured). The filler goes
// in order with everything else, so a request sent after it is answered
// only once the peer has read past it. A peer from before typePad skips
// it as garbage.
func (m *Mux) Pad(n int) {
	filler := make([]byte, MaxPayload)
	m.mu.Lock()
	defer m.mu.Unlock()
	for sent := 0; sent < n; sent += headerLen + MaxPayload {
		m.outq = append(m.outq, &pending{enc: appendFrame(nil, &frame{typ: typePad, payload: filler}), refs: 1})
	}
	m.cond.Broadcast()
}

// Freeze stops the Mux from writing to the transport and from delivering
// bytes to local readers, so its state can be captured while the peer is
// stopped. Frames still arrive and are acknowledged into the state.
// Thaw undoes it.
func (m *Mux) Freeze() {
	m.mu.Lock()
	m.frozen = true
	m.mu.Unlock()
}

// Thaw resumes writing after Freeze.
func (m *Mux) Thaw() {
	m.mu.Lock()
	m.frozen = false
	m.restartSilenceLocked() // the peer was stopped, not silent
	m.cond.Broadcast()
	m.mu.Unlock()
}

// closedErrLocked is what operations on a closed Mux return.
func (m *Mux) closedErrLocked() error {
	if m.closeErr != nil {
		return m.closeErr
	}
	return ErrClosed
}

// Close ends the Mux; every stream fails with ErrClosed.
func (m *Mux) Close() error {
	m.mu.Lock()
	m.closed = true
	m.ackTimer.Stop()
	m.cond.Broadcast()
	m.mu.Unlock()
	return nil
}

// Open starts a stream; meta travels with the open frame and tells the peer
// what the stream is for.
func (m *Mux) Open(meta []byte) (*Stream, error) {
	if len(meta) > MaxPayload {
		return nil, fmt.Errorf("opening stream: metadata is %d bytes, limit %d", len(meta), MaxPayload)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, m.closedErrLocked()
	}
	id := m.nextID
	m.nextID += 2
	s := m.newStreamLocked(id, meta)
	m.sendLocked(typeOpen, id, meta)
	return s, nil
}

// Accept waits for a stream the peer opened.
func (m *Mux) Accept(ctx context.Context) (*Stream, error) {
	stop := context.AfterFunc(ctx, func() {
		m.mu.Lock()
		m.cond.Broadcast()
		m.mu.Unlock()
	})
	defer stop()
	m.mu.Lock()
	defer m.mu.Unlock()
	for len(m.acceptq) == 0 && !m.closed && ctx.Err() == nil {
		m.cond.Wait()
	}
	if m.closed {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := m.acceptq[0]
	m.acceptq = m.acceptq[1:]
	s.accepted = true
	return s, nil
}

// Settled reports whether nothing is in flight: every frame we sent is
// acknowledged and no stream is open. Snapshot gates use it.
func (m *Mux) Settled() (bool, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if n := m.unackedLocked(); n > 0 {
		return false, fmt.Sprintf("%d frames not yet acknowledged by the guest", n)
	}
	if len(m.streams) > 0 {
		return false, fmt.Sprintf("%d streams open", len(m.streams))
	}
	return true, ""
}

func (m *Mux) newStreamLocked(id uint32, meta []byte) *Stream {
	s := &Stream{m: m, id: id, meta: meta, credit: Window, accepted: true}
	m.streams[id] = s
	return s
}

func (m *Mux) resetLocked(s *Stream, reason string) {
	if s.reset {
		return
	}
	s.reset = true
	s.resetReason = reason
	delete(m.streams, s.id)
	m.sendLocked(typeReset, s.id, []byte(reason))
}

// reapLocked forgets a stream once both directions are finished and the
// reader has everything.
func (m *Mux) reapLocked(s *Stream) {
	if s.localClosed && s.remoteClosed && s.unreadLen == 0 {
		delete(m.streams, s.id)
	}
}
