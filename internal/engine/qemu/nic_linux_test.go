package qemu

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine"
)

// TestCommandLineNIC: a NIC adds a dgram netdev on the inherited
// descriptor and a virtio-net device with the fixed MAC and no option
// ROM; without one there is neither.
func TestCommandLineNIC(t *testing.T) {
	socks := map[string]string{"qmp": "/r/qmp.sock", "console": "/r/console.sock", "channel": "/r/channel.sock"}
	for _, tc := range []struct {
		name        string
		nic         bool
		fd          int
		wantNetdev  string
		wantDevices int
	}{
		{"no NIC", false, -1, "", 0},
		{"NIC on fd 4", true, 4, "dgram,id=net0,local.type=fd,local.str=4", 1},
		{"NIC on fd 5", true, 5, "dgram,id=net0,local.type=fd,local.str=5", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := engine.Spec{CPUs: 1, RAMMB: 256, Accel: engine.AccelTCG, Kernel: "/k", Initrd: "/i", NIC: tc.nic}
			args := commandLine(spec, "console=ttyS0", tcgCPU, socks, "/proc/self/fd/3", true, "g", tc.fd, "")
			var netdevs, nics []string
			for i, a := range args {
				switch {
				case a == "-netdev":
					netdevs = append(netdevs, args[i+1])
				case a == "-device" && strings.HasPrefix(args[i+1], "virtio-net"):
					nics = append(nics, args[i+1])
				}
			}
			if tc.wantNetdev == "" {
				if len(netdevs) != 0 {
					t.Fatalf("netdevs %q without a NIC", netdevs)
				}
			} else if !slices.Equal(netdevs, []string{tc.wantNetdev}) {
				t.Fatalf("netdevs %q, want [%q]", netdevs, tc.wantNetdev)
			}
			if len(nics) != tc.wantDevices {
				t.Fatalf("NIC devices %q, want %d", nics, tc.wantDevices)
			}
			for _, d := range nics {
				for _, want := range []string{"netdev=net0", "mac=" + engine.NICMAC, "romfile="} {
					if !strings.Contains(d, want) {
						t.Fatalf("NIC device %q lacks %q", d, want)
					}
				}
			}
		})
	}
}

// TestSectionNIC: the NIC is recorded in the engine section (version 3;
// a display alone still writes 2, neither writes 1), read back, and a
// restore asking for another device set is refused naming net = 1.
func TestSectionNIC(t *testing.T) {
	for _, tc := range []struct {
		name            string
		display, nic    bool
		restoreNIC      bool
		wantVersion     int
		wantErrContains string
	}{
		{"neither", false, false, false, 1, ""},
		{"display only", true, false, false, 2, ""},
		{"NIC both ways", false, true, true, 3, ""},
		{"display and NIC", true, true, true, 3, ""},
		{"captured with a NIC, restored without", false, true, false, 3, "captured with net = 1 (network card virtio-net-pci) and this sandbox has net = 0"},
		{"captured without a NIC, restored with", false, false, true, 1, "captured with net = 0 (network card virtio-net-pci) and this sandbox has net = 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := section{RAM: ramFile, VMGenID: "g", Cmdline: "c", Display: tc.display, NIC: tc.nic}.encode()
			if err != nil {
				t.Fatal(err)
			}
			if s.Version != tc.wantVersion {
				t.Fatalf("section version %d, want %d", s.Version, tc.wantVersion)
			}
			sec, err := decodeSection(s)
			if err != nil {
				t.Fatal(err)
			}
			if sec.NIC != tc.nic || sec.Display != tc.display {
				t.Fatalf("decoded display %v NIC %v, want %v %v", sec.Display, sec.NIC, tc.display, tc.nic)
			}
			err = sec.checkDevices(engine.Spec{Display: tc.display, NIC: tc.restoreNIC})
			if tc.wantErrContains == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErrContains) || !errors.Is(err, engine.ErrDeviceMismatch) {
				t.Fatalf("err = %v, want ErrDeviceMismatch containing %q", err, tc.wantErrContains)
			}
		})
	}
}

// TestDecodeSectionNICVersion: only a version 3 section may claim a NIC,
// so an artifact cannot lose its NIC to a misread version.
func TestDecodeSectionNICVersion(t *testing.T) {
	for _, v := range []int{1, 2} {
		_, err := decodeSection(engine.Section{Version: v, Data: json.RawMessage(`{"ram":"file","vmgenid":"g","cmdline":"c","nic":true}`)})
		if err == nil || !strings.Contains(err.Error(), "cannot record a network card") {
			t.Fatalf("version %d claiming a NIC: err = %v", v, err)
		}
	}
}

// TestNICPair: the frame channel keeps each frame whole in both
// directions, the host end takes deadlines (it is in Go's poller), and
// the host sees end-of-file once the other end (QEMU) is gone.
func TestNICPair(t *testing.T) {
	host, guest, err := newNICPair()
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	frames := [][]byte{make([]byte, 60), make([]byte, 1514), []byte("\xff\xff\xff\xff\xff\xff" + strings.Repeat("x", 60))}
	for i, f := range frames {
		f[0] = byte(i + 1)
		if _, err := guest.Write(f); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 65536)
	for i, f := range frames {
		n, err := host.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if n != len(f) || buf[0] != byte(i+1) {
			t.Fatalf("frame %d: read %d bytes starting %d, want %d starting %d", i, n, buf[0], len(f), i+1)
		}
	}
	if _, err := host.Write(frames[1]); err != nil {
		t.Fatal(err)
	}
	if n, err := guest.Read(buf); err != nil || n != len(frames[1]) {
		t.Fatalf("guest read %d, %v; want %d", n, err, len(frames[1]))
	}
	host.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := host.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read with nothing sent: %v, want a deadline error", err)
	}
	host.SetReadDeadline(time.Time{})
	guest.Close()
	if _, err := host.Read(buf); err != io.EOF {
		t.Fatalf("read after the other end closed: %v, want EOF", err)
	}
}

// TestNICWithoutOne: a machine started without a NIC has none.
func TestNICWithoutOne(t *testing.T) {
	if nic := (&Machine{}).NIC(); nic != nil {
		t.Fatalf("NIC() = %v, want nil", nic)
	}
}
