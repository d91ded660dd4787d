package agentproto

import (
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestCheckEpoch(t *testing.T) {
	const restored = 0x9e3779b97f4a7c15 // a typical random post-restore epoch
	tests := []struct {
		name    string
		req     Request
		current uint64
		wantErr string // "" = admitted
	}{
		// A freshly booted guest serves 0 and a fresh host stamps 0.
		{"boot exec", Request{Op: OpExec, Command: "true"}, 0, ""},
		{"boot put", Request{Op: OpPut, Path: "/x"}, 0, ""},
		{"boot get", Request{Op: OpGet, Path: "/x"}, 0, ""},
		{"boot poweroff", Request{Op: OpPoweroff}, 0, ""},

		// After a restore only the new session's epoch is served.
		{"restored exec", Request{Op: OpExec, Epoch: restored}, restored, ""},
		{"restored poweroff", Request{Op: OpPoweroff, Epoch: restored}, restored, ""},
		{"pre-restore exec", Request{Op: OpExec}, restored, "stale session epoch 0 (agent serves 11400714819323198485)"},
		{"pre-restore put", Request{Op: OpPut, Epoch: 0}, 9, "stale session epoch 0 (agent serves 9)"},
		{"pre-restore get", Request{Op: OpGet, Epoch: 5}, 9, "stale session epoch 5 (agent serves 9)"},
		{"pre-restore poweroff", Request{Op: OpPoweroff, Epoch: 5}, 9, "stale session epoch 5 (agent serves 9)"},
		{"request from a later session", Request{Op: OpExec, Epoch: 9}, 5, "stale session epoch 9 (agent serves 5)"},
		{"epoch on a fresh guest", Request{Op: OpExec, Epoch: 9}, 0, "stale session epoch 9 (agent serves 0)"},
		{"max epoch", Request{Op: OpExec, Epoch: math.MaxUint64}, math.MaxUint64, ""},
		{"max epoch off by one", Request{Op: OpExec, Epoch: math.MaxUint64 - 1}, math.MaxUint64, "stale session epoch 18446744073709551614 (agent serves 18446744073709551615)"},

		// The handshake is how the epoch changes, and hello is the guest's.
		{"restored handshake from any epoch", Request{Op: OpRestored, Epoch: 9}, 5, ""},
		{"restored handshake back to zero", Request{Op: OpRestored}, 5, ""},
		{"hello", Request{Op: OpHello}, 5, ""},

		// A reseed is the host's request like any other: an older
		// session's is refused.
		{"reseed", Request{Op: OpReseed, Seed: "s", Epoch: 5}, 5, ""},
		{"stale reseed", Request{Op: OpReseed, Seed: "s", Epoch: 4}, 5, "stale session epoch 4 (agent serves 5)"},

		// An operation nobody taught the rule fails closed.
		{"unknown op", Request{Op: "future"}, 5, "stale session epoch 0 (agent serves 5)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckEpoch(tt.req, tt.current)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckEpoch(%+v, %d) = %v, want admitted", tt.req, tt.current, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckEpoch(%+v, %d) admitted, want %q", tt.req, tt.current, tt.wantErr)
			}
			if err.Error() != tt.wantErr {
				t.Errorf("error %q, want %q", err, tt.wantErr)
			}
			if !errors.Is(err, ErrStaleEpoch) {
				t.Errorf("error %v does not wrap ErrStaleEpoch", err)
			}
		})
	}
}

// TestEpochOnTheWire checks that the epoch a host stamps survives the
// metadata round trip, and that epoch 0 is what an old host's request
// (no epoch field) decodes to.
func TestEpochOnTheWire(t *testing.T) {
	tests := []struct {
		name      string
		req       Request
		wantField bool // whether "epoch" appears in the JSON
	}{
		{"zero omitted", Request{Op: OpExec, Command: "true"}, false},
		{"exec", Request{Op: OpExec, Command: "true", Epoch: 7}, true},
		{"put", Request{Op: OpPut, Path: "/f", Mode: 0o600, Epoch: 1 << 63}, true},
		{"get", Request{Op: OpGet, Path: "/f", Epoch: math.MaxUint64}, true},
		{"poweroff", Request{Op: OpPoweroff, Epoch: 3}, true},
		{"restored", Request{Op: OpRestored, Epoch: 42, Fork: true, Hostname: "h"}, true},
		// The seed is random bytes, so it travels as Text, byte for byte.
		{"reseed", Request{Op: OpReseed, Epoch: 42, Seed: "\x00\xff\xfe seed \x80"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.req.Encode()
			if got := strings.Contains(string(b), `"epoch"`); got != tt.wantField {
				t.Errorf("%s: epoch field present = %v, want %v", b, got, tt.wantField)
			}
			back, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, tt.req) {
				t.Fatalf("round trip: got %+v, want %+v", back, tt.req)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	tests := []struct {
		name, meta, want string
	}{
		{"not JSON", "exec", "decoding agent request"},
		{"unknown op", `{"op":"format"}`, `unknown agent operation "format"`},
		{"negative epoch", `{"op":"exec","epoch":-1}`, "decoding agent request"},
		{"epoch too large", `{"op":"exec","epoch":18446744073709551616}`, "decoding agent request"},
		{"egress without a conn id", `{"op":"egress"}`, "malformed conn id"},
		{"egress conn id that could forge the preamble", `{"op":"egress","conn":"0123456789abcde\n"}`, "malformed conn id"},
		{"egress conn id in upper case", `{"op":"egress","conn":"0123456789ABCDEF"}`, "malformed conn id"},
		{"port out of range", `{"op":"connect","port":65536}`, "decoding agent request"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.meta))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Decode(%s) = %v, want error containing %q", tt.meta, err, tt.want)
			}
		})
	}
}

// TestMaxOnTheWire checks the transfer limit survives the metadata round
// trip and that no limit (0) is what a request without the field means, so
// an older host's transfers stay unlimited.
func TestMaxOnTheWire(t *testing.T) {
	for _, req := range []Request{
		{Op: OpGet, Path: "/f"},
		{Op: OpGet, Path: "/f", Max: 1},
		{Op: OpPut, Path: "/f", Mode: 0o600, Max: 1 << 40},
		{Op: OpPut, Path: "/f", Max: math.MaxInt64},
	} {
		b := req.Encode()
		if got, want := strings.Contains(string(b), `"max"`), req.Max != 0; got != want {
			t.Errorf("%s: max field present = %v, want %v", b, got, want)
		}
		back, err := Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, req) {
			t.Errorf("round trip: got %+v, want %+v", back, req)
		}
	}
	old, err := Decode([]byte(`{"op":"get","path":"L2Y="}`))
	if err != nil || old.Max != 0 || string(old.Path) != "/f" {
		t.Fatalf("request without max decoded to %+v, %v; want path /f, max 0", old, err)
	}
}

func TestEgressNeedsNoEpoch(t *testing.T) {
	r, err := Decode([]byte(`{"op":"egress","conn":"0123456789abcdef"}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckEpoch(r, 42); err != nil {
		t.Fatalf("a guest-opened egress stream was checked for an epoch: %v", err)
	}
	if err := CheckEpoch(Request{Op: OpConnect, Port: 8080}, 42); err == nil {
		t.Fatal("a host-opened connect from another session passed the epoch check")
	}
}
