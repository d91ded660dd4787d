package main

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/nethersandbox/nether/internal/agentproto"
)

// TestServeReseed: a reseed request hands its seed, byte for byte, to
// the reseed and answers "ok" only once the reseed is done; a seed out of
// bounds, a reseed that fails and a request of another session are
// refused with the reason, and reseed nothing.
func TestServeReseed(t *testing.T) {
	seed := bytes.Repeat([]byte{0x00, 0xff, 0x80, 's'}, agentproto.MinSeed/4)
	tests := []struct {
		name      string
		epoch     uint64 // the agent serves 7
		seed      []byte
		fail      error
		wantReset string // "" = served
	}{
		{"served", 7, seed, nil, ""},
		{"the largest seed", 7, bytes.Repeat([]byte{1}, agentproto.MaxSeed), nil, ""},
		{"a seed too short", 7, seed[:agentproto.MinSeed-1], nil, "reseed: a seed of 31 bytes is too short (at least 32)"},
		{"a seed too long", 7, bytes.Repeat([]byte{1}, agentproto.MaxSeed+1), nil, "reseed: a seed of 257 bytes is too long (at most 256)"},
		{"the kernel refuses", 7, seed, errors.New("forcing a CRNG reseed (RNDRESEEDCRNG): operation not permitted"), "reseed: forcing a CRNG reseed (RNDRESEEDCRNG): operation not permitted"},
		{"another session's", 6, seed, nil, "stale session epoch 6 (agent serves 7)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ta := startAgent(t)
			var mu sync.Mutex
			var got [][]byte
			ta.a.reseedCRNG = func(seed []byte) error {
				mu.Lock()
				defer mu.Unlock()
				if tt.fail != nil {
					return tt.fail
				}
				got = append(got, bytes.Clone(seed))
				return nil
			}
			ta.restore(t, 7)
			r := ta.do(t, agentproto.Request{Op: agentproto.OpReseed, Epoch: tt.epoch, Seed: agentproto.Text(tt.seed)}, "")
			ta.waitServed(t)
			mu.Lock()
			defer mu.Unlock()
			if tt.wantReset != "" {
				if r.err == nil || !strings.Contains(r.err.Error(), tt.wantReset) {
					t.Fatalf("reseed: status %q err %v, want a reset with %q", r.status, r.err, tt.wantReset)
				}
				if len(got) != 0 {
					t.Fatalf("a refused request reseeded with %q", got)
				}
				return
			}
			if r.err != nil || r.status != "ok" {
				t.Fatalf("reseed: status %q err %v, want ok", r.status, r.err)
			}
			if len(got) != 1 || !bytes.Equal(got[0], tt.seed) {
				t.Fatalf("reseeded with %q, want [%q]", got, tt.seed)
			}
		})
	}
}
