package channel

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync/atomic"
)

// The bulk lane is memory shared by the two halves beside the transport
// (in QEMU, an ivshmem-plain device's BAR; on the host, the memfd behind
// it). A virtio-serial port hands the guest one page per buffer and
// interrupts it for each, so bytes sent through the port cost the guest
// an interrupt per 4 KiB. Through the lane a batch of whole frames is
// copied into shared memory and the port carries only a 12-byte
// descriptor for it: one interrupt per batch.
//
// The lane changes nothing the channel promises. Frames in the lane are
// the same frames with the same checksums, in the same order, because
// the descriptor takes their place in the transport's byte stream; a
// frame sent through the lane stays in the resend queue like any other
// and is resent in full through the transport when a new one attaches.
// Each batch starts with a header that repeats its descriptor's batch
// number and length; the numbers start at random for every Mux. A
// descriptor that names bytes which are no longer its batch (the lane is
// fresh memory after a restore, or a hostile guest rewrote it) is refused
// whole. Because the header proves the bytes are the batch the sender
// wrote, and the sender reuses lane memory only once every frame in it is
// acknowledged, the guest skips the payload checksums of the host's
// batches: in a TCG guest hashing every byte was a fifth of a put's time.
// The host checks them (it hashes gigabytes a second): a guest that
// scribbles over its half after writing a batch's header gets that batch
// refused rather than its bytes delivered. (The checksums guard against
// garbage, not against a peer: a hostile guest can checksum what it
// likes.) A batch must also decode to whole frames and nothing else.
//
// A refused batch is frames lost on a live transport: its receiver asks
// for them again with a resync and no announce, so the sender sends them,
// and everything after, through the transport, and stops using its half
// (the receiver no longer reads it; lane memory that changes under its
// descriptors is not worth the resends).
//
// The lane is split in two halves, one per direction: the host writes
// the first and reads the second. A sender reuses a part of its half only
// once the peer has acknowledged every frame that was in it, so a working
// peer never sees bytes change under a descriptor. The sender uses the
// lane only after the peer said it reads it (an empty typeBulk frame,
// sent by the host on every attach and by the guest in answer to each
// resync): a guest agent from before the lane, or one that could not map
// it, never gets a descriptor.

// Lane is the shared memory of a bulk lane.
type Lane interface {
	io.ReaderAt
	io.WriterAt
}

const (
	// laneMin is the smallest batch worth a trip through the lane: below
	// it the port's own buffers cost less than a descriptor.
	laneMin = 8 << 10
	// laneDescLen is a descriptor's payload, little endian: the batch's
	// offset in the sender's half and its length (u32s, the length
	// counting the batch header), and its batch number (u64).
	laneDescLen = 16
	// laneHeaderLen is the batch header: laneMagic, the length (u32) and
	// the batch number (u64), as in the descriptor.
	laneHeaderLen = 16
	laneMagic     = 0x3142_4c4e // "NLB1"
)

// laneRegion is a part of our half that holds frames the peer has not
// acknowledged yet.
type laneRegion struct {
	off, end int64
	maxSeq   uint64 // the region is free once the peer acknowledges this
}

// laneState is a Mux's view of its lane; every field is guarded by the
// Mux's lock except the memory itself.
type laneState struct {
	mem    Lane
	half   int64 // bytes per direction
	txBase int64 // where our half starts
	rxBase int64 // where the peer's half starts
	peer   bool  // the peer said it reads our half
	dead   bool  // a write to the lane failed: never again
	// rxDead: a batch of the peer's was refused; its half is never read
	// again, and we never again announce that we read it.
	// It is atomic because the read loop checks it before it takes the
	// Mux's lock.
	rxDead   atomic.Bool
	regions  []laneRegion
	head     int64 // where the next region starts in our half
	maxBatch int64
	nextID   uint64 // our next batch number
	// view is the peer's half in place, for a guest, whose peer is the
	// host it trusts not to change a batch under it; nil for the host,
	// which reads every batch into its read loop's scratch first.
	view []byte
	// counters
	batchesOut, bytesOut, batchesIn, bytesIn, refused uint64
}

// SetLane gives the Mux a bulk lane of size bytes (both halves). Call it
// before Attach. size must be at least 64 KiB.
func (m *Mux) SetLane(mem Lane, size int64) error {
	if size < 64<<10 {
		return fmt.Errorf("channel lane of %d bytes is too small (at least 64 KiB)", size)
	}
	half := size / 2
	l := &laneState{mem: mem, half: half, maxBatch: min(half/2, Window)}
	var seed [8]byte
	rand.Read(seed[:])
	l.nextID = binary.LittleEndian.Uint64(seed[:])
	if m.role == Host {
		l.txBase, l.rxBase = 0, half
	} else {
		l.txBase, l.rxBase = half, 0
		if v, ok := mem.(interface{ Bytes() []byte }); ok && int64(len(v.Bytes())) >= size {
			l.view = v.Bytes()[l.rxBase : l.rxBase+half]
		}
	}
	m.mu.Lock()
	m.lane = l
	m.mu.Unlock()
	return nil
}

// LaneStats reports what went through the lane: batches and bytes each
// way, and descriptors refused (out of bounds). All zero without a lane.
type LaneStats struct {
	Active                      bool // we send through it
	BatchesOut, BytesOut        uint64
	BatchesIn, BytesIn, Refused uint64
}

// LaneStats returns the lane's counters.
func (m *Mux) LaneStats() LaneStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.lane
	if l == nil {
		return LaneStats{}
	}
	return LaneStats{Active: l.peer, BatchesOut: l.batchesOut, BytesOut: l.bytesOut,
		BatchesIn: l.batchesIn, BytesIn: l.bytesIn, Refused: l.refused}
}

// laneAnnounce is the frame that tells the peer we read its half.
func laneAnnounce() *pending {
	return &pending{enc: appendFrame(nil, &frame{typ: typeBulk}), refs: 1}
}

// allocLocked reserves n bytes of our half for frames up to maxSeq, or
// says there is no room (the batch then goes through the transport).
func (l *laneState) allocLocked(n int64, maxSeq uint64) (int64, bool) {
	if n > l.maxBatch {
		return 0, false
	}
	if len(l.regions) == 0 {
		l.head = 0
	}
	off := l.head
	if k := len(l.regions); k > 0 {
		tail := l.regions[0].off
		wrapped := l.regions[k-1].off < tail // the live regions run past the end and on from 0
		switch {
		case !wrapped && off+n <= l.half:
		case !wrapped && n <= tail:
			off = 0 // the end of the half is too short; start again at 0
		case wrapped && off+n <= tail:
		default:
			return 0, false
		}
	} else if off+n > l.half {
		off = 0
	}
	l.regions = append(l.regions, laneRegion{off: off, end: off + n, maxSeq: maxSeq})
	l.head = off + n
	return off, true
}

// ackLocked frees the regions whose frames the peer has acknowledged.
func (l *laneState) ackLocked(ack uint64) {
	i := 0
	for i < len(l.regions) && l.regions[i].maxSeq <= ack {
		i++
	}
	if i > 0 {
		l.regions = append(l.regions[:0], l.regions[i:]...)
	}
}

// laneDescriptor is the typeBulk frame that stands for batch id, n bytes
// at off.
func laneDescriptor(off, n int64, id uint64) *pending {
	var p [laneDescLen]byte
	binary.LittleEndian.PutUint32(p[0:], uint32(off))
	binary.LittleEndian.PutUint32(p[4:], uint32(n))
	binary.LittleEndian.PutUint64(p[8:], id)
	return &pending{enc: appendFrame(nil, &frame{typ: typeBulk, payload: p[:]}), refs: 1}
}

// laneHeader is the header of batch id, n bytes long.
func laneHeader(n int64, id uint64) []byte {
	h := make([]byte, laneHeaderLen)
	binary.LittleEndian.PutUint32(h[0:], laneMagic)
	binary.LittleEndian.PutUint32(h[4:], uint32(n))
	binary.LittleEndian.PutUint64(h[8:], id)
	return h
}

// batch returns the frames of the batch a descriptor names, appended to
// into. It says false, and yields nothing, for a descriptor out of
// bounds, a failed read, bytes that are not the batch it names, or a
// batch that is not whole valid frames end to end (on the host, with
// their payload checksums), and for every descriptor once one was
// refused (rxDead).
//
// scratch is the caller's buffer for the copy (one per read loop).
func (l *laneState) batch(desc []byte, scratch *[]byte, alloc func(int) []byte, into []*frame) ([]*frame, bool) {
	off := int64(binary.LittleEndian.Uint32(desc[0:]))
	n := int64(binary.LittleEndian.Uint32(desc[4:]))
	if l.rxDead.Load() || n < laneHeaderLen+headerLen || n > l.maxBatch || off+n > l.half {
		return into, false
	}
	var b []byte
	if l.view != nil {
		b = l.view[off : off+n]
	} else {
		// One copy out of shared memory: the guest may change it under
		// us, and every check below is on our copy.
		if int64(cap(*scratch)) < n {
			*scratch = make([]byte, l.maxBatch)
		}
		b = (*scratch)[:n]
		if _, err := l.mem.ReadAt(b, l.rxBase+off); err != nil {
			return into, false
		}
	}
	if binary.LittleEndian.Uint32(b[0:]) != laneMagic || int64(binary.LittleEndian.Uint32(b[4:])) != n ||
		binary.LittleEndian.Uint64(b[8:]) != binary.LittleEndian.Uint64(desc[8:]) {
		return into, false
	}
	d := Decoder{buf: b, off: laneHeaderLen, alloc: alloc, unchecked: l.view != nil}
	start := len(into)
	for {
		f, err := d.next()
		if err != nil {
			break
		}
		if f.typ == typeBulk && len(f.payload) != 0 {
			continue // a batch never nests another (an announce may ride in one)
		}
		into = append(into, f)
	}
	// A batch holds whole valid frames only. Bytes skipped or left over
	// are frames lost (changed under the descriptor, or a sender that is
	// broken or hostile): the whole batch is refused, so that its
	// receiver asks for all of it again rather than missing some.
	if d.Skipped != 0 || d.unparsed() != 0 {
		clear(into[start:])
		return into[:start], false
	}
	return into, true
}

// laneRun is a part of a write batch: frames [from, to) of it, in the
// lane as batch id at off (n bytes with the header), or through the
// transport when off < 0.
type laneRun struct {
	from, to int
	off, n   int64
	id       uint64
}

// planLaneLocked cuts a write batch into runs and reserves lane space for
// the ones worth it. Without a lane the plan is one run through the
// transport.
func (m *Mux) planLaneLocked(batch []*pending, runs []laneRun) []laneRun {
	l := m.lane
	if l == nil || !l.peer {
		return append(runs, laneRun{from: 0, to: len(batch), off: -1})
	}
	for from := 0; from < len(batch); {
		to, n, maxSeq, pad := from, int64(laneHeaderLen), uint64(0), false
		for to < len(batch) && (to == from || n+int64(len(batch[to].enc)) <= l.maxBatch) {
			n += int64(len(batch[to].enc))
			maxSeq = max(maxSeq, batch[to].seq)
			pad = pad || batch[to].enc[2] == typePad
			to++
		}
		off, id := int64(-1), uint64(0)
		// Filler is for the port's own buffers (Mux.Pad).
		if n >= laneMin && maxSeq > 0 && !pad {
			if o, ok := l.allocLocked(n, maxSeq); ok {
				off, id = o, l.nextID
				l.nextID++
			}
		}
		// Runs through the transport merge: fewer, larger writes.
		if k := len(runs); off < 0 && k > 0 && runs[k-1].off < 0 {
			runs[k-1].to = to
		} else {
			runs = append(runs, laneRun{from: from, to: to, off: off, n: n, id: id})
		}
		from = to
	}
	return runs
}

// laneWrite copies the lane runs of a batch into our half and returns
// what goes on the transport: the other runs' frames and a descriptor in
// place of each lane run. It runs outside the Mux's lock (the write loop
// is the only writer of our half). A failed copy sends its run, and every
// later one, through the transport, and ends the lane for this Mux.
func (m *Mux) laneWrite(batch []*pending, runs []laneRun, ack uint64, bufs net.Buffers) net.Buffers {
	failed := false
	var batches, bytes uint64
	for _, r := range runs {
		if r.off >= 0 && !failed {
			at := m.lane.txBase + r.off
			if _, err := m.lane.mem.WriteAt(laneHeader(r.n, r.id), at); err != nil {
				m.log.Warn("channel: bulk lane write failed; sending through the port from now on", "err", err)
				failed = true
			}
			at += laneHeaderLen
			for _, p := range batch[r.from:r.to] {
				if failed {
					break
				}
				if _, err := m.lane.mem.WriteAt(p.enc, at); err != nil {
					m.log.Warn("channel: bulk lane write failed; sending through the port from now on", "err", err)
					failed = true
					break
				}
				at += int64(len(p.enc))
			}
			if !failed {
				d := laneDescriptor(r.off, r.n, r.id)
				setAck(d.enc, ack)
				bufs = append(bufs, d.enc)
				batches++
				bytes += uint64(r.n)
				continue
			}
		}
		for _, p := range batch[r.from:r.to] {
			bufs = append(bufs, p.enc)
		}
	}
	if batches > 0 || failed { // only ever with a lane
		m.mu.Lock()
		m.lane.batchesOut += batches
		m.lane.bytesOut += bytes
		if failed {
			m.lane.peer = false
			m.lane.dead = true
		}
		m.mu.Unlock()
	}
	return bufs
}
