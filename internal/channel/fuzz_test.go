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
