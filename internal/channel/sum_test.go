package channel

import (
	"fmt"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestXXH64 checks the payload checksum against values computed by the
// reference implementation (libxxhash 0.8.1, XXH64 with seed 0), at every
// length class the algorithm treats apart: under 4, under 8, under 32,
// exactly 32, and the stripes-plus-tail lengths past it.
func TestXXH64(t *testing.T) {
	all := make([]byte, 0, 771)
	for i := 0; i < 3; i++ {
		for b := 0; b < 256; b++ {
			all = append(all, byte(b))
		}
	}
	all = append(all, "xyz"...)
	pat := make([]byte, 200)
	for i := range pat {
		pat[i] = byte(i*7 + 3)
	}
	cases := []struct {
		in   []byte
		want uint64
	}{
		{nil, 0xef46db3751d8e999},
		{[]byte("a"), 0xd24ec4f1a98c6e5b},
		{[]byte("abc"), 0x44bc2cf5ad770999},
		{[]byte("message digest"), 0x066ed728fceeb3be},
		{[]byte("abcdefghijklmnopqrstuvwxyz"), 0xcfe1f278fa89835c},
		{all, 0xe921a1b45bd779f8},
		{pat[:31], 0xa2aa5f33cc4a6119},
		{pat[:32], 0x23c3c17ef790fd97},
		{pat[:33], 0x50a7cfc7ba588784},
		{pat[:35], 0xa5b3456011d2913b},
		{pat[:36], 0xc0b52b0dcc5e3f7f},
		{pat[:39], 0x880bbeea606e4b37},
		{pat[:40], 0xb620306b253d76b6},
		{pat[:63], 0x5e3e54b431c7493c},
		{pat[:64], 0x0eb64b3ef6eeb01f},
		{pat[:65], 0xa383b724b2bd12f1},
		{pat[:100], 0xa61f8d4c170fe531},
		{pat[:200], 0xa6cb3c09bc829b24},
	}
	for _, c := range cases {
		t.Run(fmt.Sprint(len(c.in)), func(t *testing.T) {
			if got := xxhash.Sum64(c.in); got != c.want {
				t.Fatalf("xxh64 of %d bytes = %#x, want %#x", len(c.in), got, c.want)
			}
			if got := payloadSum(c.in); got != uint32(c.want) {
				t.Fatalf("payloadSum of %d bytes = %#x, want the low half of %#x", len(c.in), got, c.want)
			}
		})
	}
}

func BenchmarkPayloadSum(b *testing.B) {
	p := make([]byte, 32<<10)
	b.SetBytes(int64(len(p)))
	for i := 0; i < b.N; i++ {
		payloadSum(p)
	}
}
