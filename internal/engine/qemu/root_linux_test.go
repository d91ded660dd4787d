package qemu

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/engine"
)

// TestCommandLineRootImage: a root image is one read-only raw drive on a
// virtio-blk device with the serial the agent looks for; a comma in its
// path is escaped so it cannot add options; without one there is no drive.
func TestCommandLineRootImage(t *testing.T) {
	socks := map[string]string{"qmp": "/r/qmp.sock", "console": "/r/console.sock", "channel": "/r/channel.sock"}
	for _, tc := range []struct {
		name, image string
		wantDrive   string
	}{
		{"none", "", ""},
		{"plain path", "/cache/rootfs.img", "file=/cache/rootfs.img,format=raw,if=none,id=root,readonly=on"},
		{"comma in the path", "/a,b/readonly=off", "file=/a,,b/readonly=off,format=raw,if=none,id=root,readonly=on"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := engine.Spec{CPUs: 1, RAMMB: 256, Accel: engine.AccelTCG, Kernel: "/k", Initrd: "/i", RootImage: tc.image}
			args := commandLine(spec, "console=ttyS0", tcgCPU, socks, "/proc/self/fd/3", true, "g", -1, "")
			var drives, blks []string
			for i, a := range args {
				switch {
				case a == "-drive":
					drives = append(drives, args[i+1])
				case a == "-device" && strings.HasPrefix(args[i+1], "virtio-blk"):
					blks = append(blks, args[i+1])
				}
			}
			if tc.wantDrive == "" {
				if len(drives)+len(blks) != 0 {
					t.Fatalf("drives %q, devices %q without a root image", drives, blks)
				}
				return
			}
			if len(drives) != 1 || drives[0] != tc.wantDrive {
				t.Fatalf("drives %q, want [%q]", drives, tc.wantDrive)
			}
			if len(blks) != 1 || !strings.Contains(blks[0], "drive=root") || !strings.Contains(blks[0], "serial="+engine.RootImageSerial) {
				t.Fatalf("block devices %q, want one on drive root with serial %s", blks, engine.RootImageSerial)
			}
		})
	}
}

// TestSectionRootImage: a root image is recorded (version 4), read back,
// and a restore with another device set is refused naming rootfs.
func TestSectionRootImage(t *testing.T) {
	for _, tc := range []struct {
		name            string
		root, restore   bool
		wantVersion     int
		wantErrContains string
	}{
		{"none", false, false, 1, ""},
		{"root image both ways", true, true, 4, ""},
		{"captured with one, restored without", true, false, 4, "captured with a root image (a block device) and this sandbox has no root image"},
		{"captured without, restored with", false, true, 1, "captured with no root image (rootfs = busybox) and this sandbox has a root image"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := section{RAM: ramFile, VMGenID: "g", Cmdline: "c", RootImage: tc.root}.encode()
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
			if sec.RootImage != tc.root {
				t.Fatalf("decoded root image %v, want %v", sec.RootImage, tc.root)
			}
			spec := engine.Spec{}
			if tc.restore {
				spec.RootImage = "/cache/rootfs.img"
			}
			err = sec.checkDevices(spec)
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
	for _, v := range []int{1, 2, 3} {
		_, err := decodeSection(engine.Section{Version: v, Data: json.RawMessage(`{"ram":"file","vmgenid":"g","cmdline":"c","root_image":true}`)})
		if err == nil || !strings.Contains(err.Error(), "cannot record a root image") {
			t.Fatalf("version %d claiming a root image: err = %v", v, err)
		}
	}
}
