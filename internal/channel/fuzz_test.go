package channel

import (
	"bytes"
	"testing"
)

// FuzzDecoder feeds arbitrary bytes, split at an arbitrary point, to the
// decoder. It must never panic, never return a frame whose payload exceeds
// MaxPayload, and never lose a valid frame appended after the garbage.
func FuzzDecoder(f *testing.F) {
	valid := appendFrame(nil, &frame{typ: typeData, stream: 3, seq: 9, payload: []byte("payload")})
	f.Add([]byte{}, 0)
	f.Add(valid, 5)
	f.Add(append([]byte{magic0, magic1}, valid...), 1)
	f.Add(appendFrame(nil, &frame{typ: typeAck, ack: 4}), 36)
	f.Add(bytes.Repeat([]byte{magic0}, 100), 50)
	f.Fuzz(func(t *testing.T, garbage []byte, split int) {
		in := append(append([]byte(nil), garbage...), valid...)
		if split < 0 {
			split = -split
		}
		split %= len(in) + 1
		var d Decoder
		var got []*frame
		for _, part := range [][]byte{in[:split], in[split:]} {
			d.Feed(part)
			for {
				fr, err := d.next()
				if err != nil {
					break
				}
				if len(fr.payload) > MaxPayload {
					t.Fatalf("payload of %d bytes", len(fr.payload))
				}
				if sequenced(fr.typ) != (fr.seq != 0) {
					t.Fatalf("sequencing rule broken: %v", fr)
				}
				got = append(got, fr)
			}
		}
		// The valid frame at the end must come out last, unless the
		// garbage itself ended in a frame prefix that swallowed it: a
		// decoder can only lose it to bytes that form a valid header.
		if len(got) == 0 {
			t.Fatalf("valid trailing frame lost after %d garbage bytes", len(garbage))
		}
	})
}

// FuzzLaneBatch hands a host Mux's lane an arbitrary descriptor over
// arbitrary lane bytes (what a hostile guest controls). It must never
// panic, never read outside the guest's half, and yield frames only for
// a batch whose header matches its descriptor, each within the limits.
func FuzzLaneBatch(f *testing.F) {
	frames := appendFrame(nil, &frame{typ: typeData, stream: 2, seq: 1, payload: []byte("payload")})
	batch := append(laneHeader(int64(laneHeaderLen+len(frames)), 5), frames...)
	desc := laneDescriptor(0, int64(len(batch)), 5).enc[headerLen:]
	f.Add(desc, batch)
	f.Add(desc, batch[:len(batch)-3])
	torn := append([]byte(nil), batch...)
	torn[len(torn)-1] ^= 1 // a payload changed under the descriptor
	f.Add(desc, torn)
	f.Add(make([]byte, laneDescLen), []byte{})
	f.Add(bytes.Repeat([]byte{0xff}, laneDescLen), bytes.Repeat([]byte{magic0, magic1}, 64))
	f.Fuzz(func(t *testing.T, desc, mem []byte) {
		if len(desc) != laneDescLen {
			return
		}
		const size = 256 << 10
		lane := newMemLane(size)
		lane.WriteAt(mem[:min(len(mem), size/2)], size/2) // the guest's half
		m := New(Host, quietLog())
		defer m.Close()
		m.SetLane(lane, size)
		got, ok := m.lane.batch(desc, new([]byte), nil, nil)
		if !ok && len(got) != 0 {
			t.Fatalf("a refused batch yielded %d frames", len(got))
		}
		// A batch the host takes is whole frames, each standing in it
		// byte for byte with its own checksums: nothing the guest changed
		// under the descriptor is delivered.
		at := laneHeaderLen
		for _, fr := range got {
			if len(fr.payload) > MaxPayload || sequenced(fr.typ) != (fr.seq != 0) {
				t.Fatalf("invalid frame from a batch: %v", fr)
			}
			enc := appendFrame(nil, fr)
			i := bytes.Index(mem[min(at, len(mem)):], enc)
			if i < 0 {
				t.Fatalf("a frame from a batch is not in it as encoded: %v", fr)
			}
			at += i + len(enc)
		}
	})
}
