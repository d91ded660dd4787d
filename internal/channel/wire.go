// Package channel is the multiplexed, reliable byte-stream protocol that
// carries every host<->guest stream over one virtio-serial port.
//
// Both halves (nether and the in-guest agent) run the same Mux. The design
// goals, in order:
//
//   - Nothing is lost or duplicated across a snapshot. Every frame that
//     matters carries a link sequence number and stays in the sender's
//     resend queue until the peer acknowledges it. When the transport is
//     replaced (a restored or forked QEMU process connects), both sides
//     resend what is unacknowledged and the receiver drops what it has seen.
//   - A hostile or confused peer cannot stall or crash the other side:
//     headers are checksummed separately from payloads so a false frame
//     start is rejected before we wait for its payload, payloads are
//     bounded, and each stream has a credit window the sender must respect.
//   - The state is a plain struct that serialises (see state.go), because a
//     snapshot has to carry the host half.
package channel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// Frame types. Sequenced frames are retransmitted until acknowledged.
const (
	typeOpen   byte = 1 // sequenced: open stream, payload = opener's metadata
	typeData   byte = 2 // sequenced: stream bytes
	typeClose  byte = 3 // sequenced: sender will send no more; payload = status
	typeReset  byte = 4 // sequenced: abort the stream in both directions; payload = reason
	typeWindow byte = 5 // sequenced: grant credit; payload = uint32 bytes
	typeAck    byte = 6 // unsequenced: carries only the ack field
	typeResync byte = 7 // unsequenced: "I have a new transport, resend what I lack"
	// typeBulk is unsequenced: empty, "I read your half of the bulk lane";
	// else a descriptor of a batch of frames in the sender's half (lane.go).
	typeBulk byte = 8
	// typePad is unsequenced filler the receiver discards (Mux.Pad).
	typePad byte = 9
)

const (
	magic0 = 0xA7
	magic1 = 0x4E

	headerLen = 36
	// MaxPayload bounds a single frame so a decoder never buffers more than
	// this for one frame, whatever the peer claims.
	MaxPayload = 32 << 10
	// Window is the per-stream, per-direction credit window: what a
	// receiver may have to hold for a stream it does not read. 1 MiB, not
	// 256 KiB: a guest sending a file waited for credit for a third to a
	// half of a __get__ (block profile of the agent in a TCG guest: 0.9-1.2
	// s of 2.1-2.9 s), since a window grant's way back through the
	// guest's scheduler and QEMU takes longer than sending 128 KiB; with 1
	// MiB the guest's CPU was idle less (from ~35% to ~25-30% of a get).
	Window = 1 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frame is one decoded wire frame.
type frame struct {
	typ     byte
	stream  uint32
	seq     uint64 // 0 for unsequenced frames
	ack     uint64 // cumulative: highest peer seq received in order
	payload []byte
}

func sequenced(t byte) bool { return t >= typeOpen && t <= typeWindow }

// Layout (little endian):
//
//	0  magic [2]
//	2  type
//	3  reserved (0)
//	4  stream u32
//	8  seq u64
//	16 ack u64
//	24 payload length u32
//	28 payload checksum u32 (payloadSum: low half of XXH64)
//	32 header crc32c u32 over bytes 0..31
func appendFrame(dst []byte, f *frame) []byte {
	start := len(dst)
	dst = append(dst, make([]byte, headerLen)...)
	dst = append(dst, f.payload...)
	enc := dst[start:]
	sealPayload(enc)
	putHeader(enc, f.typ, f.stream, f.seq, f.ack)
	return dst
}

// sealPayload writes the payload's length and checksum into the header of
// enc, a frame whose payload is enc[headerLen:]. It is the per-byte part
// of encoding, done before the frame is numbered (and outside the Mux's
// lock).
func sealPayload(enc []byte) {
	p := enc[headerLen:]
	binary.LittleEndian.PutUint32(enc[24:], uint32(len(p)))
	binary.LittleEndian.PutUint32(enc[28:], payloadSum(p))
}

// putHeader writes the rest of the header of a sealed frame, and the
// header's checksum.
func putHeader(enc []byte, typ byte, stream uint32, seq, ack uint64) {
	enc[0], enc[1], enc[2], enc[3] = magic0, magic1, typ, 0
	binary.LittleEndian.PutUint32(enc[4:], stream)
	binary.LittleEndian.PutUint64(enc[8:], seq)
	binary.LittleEndian.PutUint64(enc[16:], ack)
	binary.LittleEndian.PutUint32(enc[32:], crc32.Checksum(enc[:32], castagnoli))
}

// setAck rewrites the ack field of an encoded frame in place. Frames wait in
// the resend queue already encoded; the ack they carry is whatever is true
// when they are (re)sent.
func setAck(enc []byte, ack uint64) {
	binary.LittleEndian.PutUint64(enc[16:], ack)
	binary.LittleEndian.PutUint32(enc[32:], crc32.Checksum(enc[:32], castagnoli))
}

var errNeedMore = errors.New("need more bytes")

// Decoder turns a byte stream into frames. It resynchronises after garbage:
// a partial frame left in a socket by a process that died mid-write, or
// bytes from a peer that is not speaking the protocol. Skipped bytes are
// counted so the caller can log them.
//
// Its buffer is reused: bytes are read (readFrom) or fed (Feed) into its
// free tail, and each payload is copied out into a buffer of its own, so
// no frame keeps the decoder's memory alive and the unparsed tail can be
// moved to the front in place.
type Decoder struct {
	buf     []byte // unparsed bytes are buf[off:]
	off     int
	Skipped uint64
	// alloc returns a buffer of length n for a payload; nil means make.
	alloc func(n int) []byte
	// unchecked skips the payload checksums: a bulk lane batch, whose
	// header already proved the bytes are the batch the descriptor
	// names (lane.go).
	unchecked bool
}

// decoderBuf is the size of the buffer a transport is read into: room
// for a whole frame of the largest size plus a transport read (up to 64
// KiB on a host socket; a virtio-serial port hands the guest at most one
// page per read).
const decoderBuf = 2*(headerLen+MaxPayload) + 64<<10

// minRead is the least free space readFrom offers a read.
const minRead = 16 << 10

// Feed appends bytes to the decoder's buffer.
func (d *Decoder) Feed(p []byte) {
	d.reserve(len(p))
	d.buf = append(d.buf, p...)
}

// readFrom does one Read of r straight into the buffer's free tail.
func (d *Decoder) readFrom(r io.Reader) (int, error) {
	if d.buf == nil {
		d.buf = make([]byte, 0, decoderBuf)
	}
	d.reserve(minRead)
	n, err := r.Read(d.buf[len(d.buf):cap(d.buf)])
	d.buf = d.buf[:len(d.buf)+n]
	return n, err
}

// reserve makes room for n more bytes at the end of the buffer: it moves
// the unparsed bytes to the front, or into a larger buffer when they and
// n do not fit.
func (d *Decoder) reserve(n int) {
	if cap(d.buf)-len(d.buf) >= n {
		return
	}
	// The unparsed bytes (part of a frame, perhaps an open: see next)
	// leave no copy behind where they were.
	unparsed := len(d.buf) - d.off
	if unparsed+n <= cap(d.buf) {
		copy(d.buf, d.buf[d.off:])
		clear(d.buf[max(unparsed, d.off):])
		d.buf, d.off = d.buf[:unparsed], 0
		return
	}
	nb := make([]byte, unparsed, max(unparsed+n, 2*cap(d.buf)))
	copy(nb, d.buf[d.off:])
	clear(d.buf[d.off:])
	d.buf, d.off = nb, 0
}

// next returns the next valid frame, or errNeedMore. It never returns any
// other error: invalid bytes are skipped, because on a virtio-serial port
// a frame boundary lost across a restore is normal, not fatal.
func (d *Decoder) next() (*frame, error) {
	for {
		b := d.buf[d.off:]
		// Find the magic.
		i := 0
		for i+1 < len(b) && !(b[i] == magic0 && b[i+1] == magic1) {
			i++
		}
		if i > 0 {
			if i+1 >= len(b) && b[len(b)-1] == magic0 {
				i = len(b) - 1 // keep a trailing magic0: it may start a frame
			}
			d.drop(i)
			b = b[i:]
		}
		if len(b) < headerLen {
			d.shrink()
			return nil, errNeedMore
		}
		h := b[:headerLen]
		if crc32.Checksum(h[:32], castagnoli) != binary.LittleEndian.Uint32(h[32:]) || h[3] != 0 {
			d.drop(1)
			continue
		}
		n := int(binary.LittleEndian.Uint32(h[24:]))
		t := h[2]
		if n > MaxPayload || t < typeOpen || t > typePad {
			d.drop(1)
			continue
		}
		if len(b) < headerLen+n {
			return nil, errNeedMore
		}
		p := b[headerLen : headerLen+n]
		if !d.unchecked && payloadSum(p) != binary.LittleEndian.Uint32(h[28:]) {
			d.drop(1)
			continue
		}
		f := &frame{
			typ:    t,
			stream: binary.LittleEndian.Uint32(h[4:]),
			seq:    binary.LittleEndian.Uint64(h[8:]),
			ack:    binary.LittleEndian.Uint64(h[16:]),
		}
		d.off += headerLen + n
		if sequenced(t) != (f.seq != 0) {
			d.Skipped += uint64(headerLen + n)
			continue
		}
		if n > 0 && t != typePad {
			if d.alloc != nil {
				f.payload = d.alloc(n)
			} else {
				f.payload = make([]byte, n)
			}
			copy(f.payload, p)
			if t == typeOpen {
				// An open's metadata may carry secrets (a provision, a
				// restore handshake): its only copy is the payload, which
				// its reader zeroes when done, never the bytes it was
				// parsed from, which stay in a reused buffer (or the
				// bulk lane) until overwritten.
				clear(p)
			}
		}
		return f, nil
	}
}

func (d *Decoder) drop(n int) {
	d.Skipped += uint64(n)
	d.off += n
}

// shrink gives back a buffer that grew past its usual size (Feed with a
// large slice) once it holds little again.
func (d *Decoder) shrink() {
	if unparsed := len(d.buf) - d.off; unparsed == 0 {
		d.buf, d.off = d.buf[:0], 0
		if cap(d.buf) > 2*decoderBuf {
			d.buf = nil
		}
	}
}

// unparsed is the number of bytes fed and not yet parsed.
func (d *Decoder) unparsed() int { return len(d.buf) - d.off }

func (f *frame) String() string {
	return fmt.Sprintf("frame{type=%d stream=%d seq=%d ack=%d len=%d}", f.typ, f.stream, f.seq, f.ack, len(f.payload))
}
