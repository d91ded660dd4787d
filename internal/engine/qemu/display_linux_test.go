package qemu

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/engine"
)

// TestCommandLineDisplay: a display adds the virtio-vga device, keeping
// its VGA BIOS; without one there is no display device at all.
func TestCommandLineDisplay(t *testing.T) {
	socks := map[string]string{"qmp": "/r/qmp.sock", "console": "/r/console.sock", "channel": "/r/channel.sock"}
	for _, tc := range []struct {
		name    string
		display bool
	}{{"no display", false}, {"display", true}} {
		t.Run(tc.name, func(t *testing.T) {
			spec := engine.Spec{CPUs: 1, RAMMB: 256, Accel: engine.AccelTCG, Kernel: "/k", Initrd: "/i", Display: tc.display}
			args := commandLine(spec, "console=ttyS0", tcgCPU, socks, "/proc/self/fd/3", true, "g", -1, "")
			var devices []string
			for i, a := range args {
				if a == "-device" {
					devices = append(devices, args[i+1])
				}
			}
			has := slices.Contains(devices, displayDevice)
			if has != tc.display {
				t.Fatalf("devices %q: display device present = %v, want %v", devices, has, tc.display)
			}
			for _, d := range devices {
				if strings.Contains(d, "vga") && d != displayDevice {
					t.Fatalf("unexpected display device %q", d)
				}
			}
			// -nodefaults keeps QEMU from adding its own VGA card, and
			// -display none keeps it from opening a window.
			if !slices.Contains(args, "-nodefaults") || !slices.Contains(args, "none") {
				t.Fatalf("args lost -nodefaults or -display none: %q", args)
			}
		})
	}
}

// TestSectionDisplay: the display is recorded in the engine section (a
// version 2 section; a machine without one still writes version 1), read
// back, and a restore asking for another device set is refused naming
// gpu.
func TestSectionDisplay(t *testing.T) {
	for _, tc := range []struct {
		name        string
		captured    bool
		restore     bool
		wantVersion int
		wantErr     string
	}{
		{"no display both ways", false, false, 1, ""},
		{"display both ways", true, true, 2, ""},
		{"captured with a display, restored without", true, false, 2, "captured with gpu = 1 (display device virtio-vga) and this sandbox has gpu = 0"},
		{"captured without a display, restored with", false, true, 1, "captured with gpu = 0 (display device virtio-vga) and this sandbox has gpu = 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := section{RAM: ramFile, VMGenID: "g", Cmdline: "c", Display: tc.captured}.encode()
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
			if sec.Display != tc.captured {
				t.Fatalf("decoded display %v, want %v", sec.Display, tc.captured)
			}
			err = sec.checkDevices(engine.Spec{Display: tc.restore})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.Is(err, engine.ErrDeviceMismatch) {
				t.Fatalf("err = %v, want ErrDeviceMismatch containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestDecodeSectionVersions: sections written before displays existed
// still restore (without a display); a version 1 section claiming a
// display, and versions from the future, are refused.
func TestDecodeSectionVersions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		version int
		data    string
		wantErr string
	}{
		{"version 1 from before displays", 1, `{"ram":"file","vmgenid":"g","cmdline":"c"}`, ""},
		{"version 2 without a display", 2, `{"ram":"stream","vmgenid":"g","cmdline":"c"}`, ""},
		{"version 1 claiming a display", 1, `{"ram":"file","vmgenid":"g","cmdline":"c","display":true}`, "cannot record a display"},
		{"version 4 claiming a disk", 4, `{"ram":"file","vmgenid":"g","cmdline":"c","disk":true}`, "cannot record a persistent disk"},
		{"version 5 claiming a lane", 5, `{"ram":"file","vmgenid":"g","cmdline":"c","lane":4194304}`, "cannot record a bulk lane"},
		{"version 6 with a lane", 6, `{"ram":"file","vmgenid":"g","cmdline":"c","lane":4194304}`, ""},
		{"a lane of a size this nether never makes", 6, `{"ram":"file","vmgenid":"g","cmdline":"c","lane":1099511627776}`, "a bulk lane of 1099511627776 bytes"},
		{"version 7", 7, `{"ram":"file","vmgenid":"g","cmdline":"c"}`, "reads up to 6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeSection(engine.Section{Version: tc.version, Data: json.RawMessage(tc.data)})
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestScreendumpWithoutDisplay: a machine without a display says so
// before touching QMP.
func TestScreendumpWithoutDisplay(t *testing.T) {
	_, err := (&Machine{}).Screendump(t.Context())
	if !errors.Is(err, engine.ErrNoDisplay) {
		t.Fatalf("err = %v, want ErrNoDisplay", err)
	}
}
