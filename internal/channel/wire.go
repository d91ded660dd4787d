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
)

const (
	magic0 = 0xA7
	magic1 = 0x4E

	headerLen = 36
	// MaxPayload bounds a single frame so a decoder never buffers more than
	// this for one frame, whatever the peer claims.
	MaxPayload = 32 << 10
	// Window is the per-stream, per-direction credit window.
	Window = 256 << 10
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
//	28 payload crc32c u32
//	32 header crc32c u32 over bytes 0..31
func appendFrame(dst []byte, f *frame) []byte {
	var h [headerLen]byte
	h[0], h[1], h[2] = magic0, magic1, f.typ
	binary.LittleEndian.PutUint32(h[4:], f.stream)
	binary.LittleEndian.PutUint64(h[8:], f.seq)
	binary.LittleEndian.PutUint64(h[16:], f.ack)
	binary.LittleEndian.PutUint32(h[24:], uint32(len(f.payload)))
	binary.LittleEndian.PutUint32(h[28:], crc32.Checksum(f.payload, castagnoli))
	binary.LittleEndian.PutUint32(h[32:], crc32.Checksum(h[:32], castagnoli))
	dst = append(dst, h[:]...)
	return append(dst, f.payload...)
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
type Decoder struct {
	buf     []byte
	Skipped uint64
}

// Feed appends bytes to the decoder's buffer.
func (d *Decoder) Feed(p []byte) { d.buf = append(d.buf, p...) }

// next returns the next valid frame, or errNeedMore. It never returns any
// other error: invalid bytes are skipped, because on a virtio-serial port
// a frame boundary lost across a restore is normal, not fatal.
func (d *Decoder) next() (*frame, error) {
	for {
		// Find the magic.
		i := 0
		for i+1 < len(d.buf) && !(d.buf[i] == magic0 && d.buf[i+1] == magic1) {
			i++
		}
		if i > 0 {
			if i+1 >= len(d.buf) && d.buf[len(d.buf)-1] == magic0 {
				i = len(d.buf) - 1 // keep a trailing magic0: it may start a frame
			}
			d.Skipped += uint64(i)
			d.buf = d.buf[i:]
		}
		if len(d.buf) < headerLen {
			d.compact()
			return nil, errNeedMore
		}
		h := d.buf[:headerLen]
		if crc32.Checksum(h[:32], castagnoli) != binary.LittleEndian.Uint32(h[32:]) || h[3] != 0 {
			d.drop(1)
			continue
		}
		n := int(binary.LittleEndian.Uint32(h[24:]))
		t := h[2]
		if n > MaxPayload || t < typeOpen || t > typeResync {
			d.drop(1)
			continue
		}
		if len(d.buf) < headerLen+n {
			d.compact()
			return nil, errNeedMore
		}
		p := d.buf[headerLen : headerLen+n]
		if crc32.Checksum(p, castagnoli) != binary.LittleEndian.Uint32(h[28:]) {
			d.drop(1)
			continue
		}
		f := &frame{
			typ:     t,
			stream:  binary.LittleEndian.Uint32(h[4:]),
			seq:     binary.LittleEndian.Uint64(h[8:]),
			ack:     binary.LittleEndian.Uint64(h[16:]),
			payload: append([]byte(nil), p...),
		}
		d.buf = d.buf[headerLen+n:]
		if sequenced(t) != (f.seq != 0) {
			d.Skipped += uint64(headerLen + n)
			continue
		}
		return f, nil
	}
}

func (d *Decoder) drop(n int) {
	d.Skipped += uint64(n)
	d.buf = d.buf[n:]
}

// compact moves the unread tail to the front so the buffer does not grow
// without bound across many frames.
func (d *Decoder) compact() {
	if cap(d.buf) > 4*(MaxPayload+headerLen) && len(d.buf) < cap(d.buf)/4 {
		d.buf = append([]byte(nil), d.buf...)
	}
}

func (f *frame) String() string {
	return fmt.Sprintf("frame{type=%d stream=%d seq=%d ack=%d len=%d}", f.typ, f.stream, f.seq, f.ack, len(f.payload))
}
