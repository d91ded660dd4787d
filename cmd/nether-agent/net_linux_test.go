package main

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// littleEndian: the expected bytes below are spelled for x86_64, where
// netlink's host byte order is little-endian.
func littleEndian(t *testing.T) {
	t.Helper()
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("expected bytes are little-endian")
	}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.Join(strings.Fields(s), ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestNetlinkRequests: the address and route requests are byte for byte
// what `ip addr add 10.0.2.15/24 dev eth0` and `ip route add default via
// 10.0.2.2 dev eth0` send (their fixed bodies and attributes), and
// attributes whose data is not a multiple of 4 are padded.
func TestNetlinkRequests(t *testing.T) {
	littleEndian(t)
	for _, tc := range []struct {
		name string
		got  []byte
		want string
	}{
		{"address", addrRequest(1, 2, netip.MustParsePrefix("10.0.2.15/24")), `
			28000000 1400 0506 01000000 00000000
			02 18 00 00 02000000
			0800 0200 0a00020f
			0800 0100 0a00020f`},
		{"default route", routeRequest(7, 3, netip.MustParseAddr("10.0.2.2")), `
			2c000000 1800 0506 07000000 00000000
			02 00 00 00 fe 03 00 01 00000000
			0800 0500 0a000202
			0800 0400 03000000`},
		{"link address", linkAddressRequest(5, 3, net.HardwareAddr{0x02, 0x6e, 0x65, 0x74, 0x68, 0x72}), `
			2c000000 1300 0500 05000000 00000000
			00 00 0000 03000000 00000000 00000000
			0a00 0100 026e65746872 0000`},
		{"padding", nlMessage(0x10, unix.NLM_F_REQUEST, 9, []byte{1, 2}, nlAttr{3, []byte{0xaa}}, nlAttr{4, nil}), `
			20000000 1000 0100 09000000 00000000
			0102 0000
			0500 0300 aa000000
			0400 0400`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if want := unhex(t, tc.want); string(tc.got) != string(want) {
				t.Fatalf("got\n%x\nwant\n%x", tc.got, want)
			}
		})
	}
}

// TestParseAck: the acknowledgement of our request ends the wait, with
// the kernel's error if there is one; others' messages are skipped, and a
// malformed reply is an error rather than a loop.
func TestParseAck(t *testing.T) {
	littleEndian(t)
	ack := func(seq uint32, errno int32) string {
		b := binary.LittleEndian.AppendUint32(nil, 36)
		b = binary.LittleEndian.AppendUint16(b, unix.NLMSG_ERROR)
		b = binary.LittleEndian.AppendUint16(b, 0)
		b = binary.LittleEndian.AppendUint32(b, seq)
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint32(b, uint32(errno))
		return hex.EncodeToString(append(b, make([]byte, 16)...)) // the request's header, echoed
	}
	for _, tc := range []struct {
		name     string
		reply    string
		wantDone bool
		wantErr  error
		wantText string
	}{
		{"success", ack(5, 0), true, nil, ""},
		{"exists", ack(5, -int32(unix.EEXIST)), true, unix.EEXIST, ""},
		{"unreachable", ack(5, -int32(unix.ENETUNREACH)), true, unix.ENETUNREACH, ""},
		{"another request's ack", ack(4, 0), false, nil, ""},
		{"another then ours", ack(4, 0) + ack(5, -int32(unix.EINVAL)), true, unix.EINVAL, ""},
		{"empty", "", false, nil, ""},
		{"length past the end", "ff000000 0200 0000 05000000 00000000", false, nil, "malformed"},
		{"length under a header", "04000000 0200 0000 05000000 00000000", false, nil, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, err := parseAck(unhex(t, tc.reply), 5)
			if done != tc.wantDone {
				t.Fatalf("done = %v, want %v", done, tc.wantDone)
			}
			switch {
			case tc.wantText != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantText) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantText)
				}
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			}
		})
	}
}

func TestNetworkFiles(t *testing.T) {
	for _, tc := range []struct{ name, got, want string }{
		{"resolv.conf", resolvConf(nameserver), "nameserver 10.0.2.3\n"},
		{"hosts", hostsFile("sandbox-7k2"), "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox-7k2\n"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}
