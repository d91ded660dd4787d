package main

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// fakePCI makes a sysfs-like PCI device directory; resource2 is an
// ordinary file, which maps as the BAR does.
func fakePCI(t *testing.T, root, slot, vendor, device string, enabled bool, bar int) string {
	t.Helper()
	d := filepath.Join(root, slot)
	os.MkdirAll(d, 0o755)
	os.WriteFile(filepath.Join(d, "vendor"), []byte(vendor+"\n"), 0o644)
	os.WriteFile(filepath.Join(d, "device"), []byte(device+"\n"), 0o644)
	en := "0\n"
	if enabled {
		en = "1\n"
	}
	os.WriteFile(filepath.Join(d, "enable"), []byte(en), 0o644)
	if bar > 0 {
		os.WriteFile(filepath.Join(d, laneBAR), make([]byte, bar), 0o600)
	}
	return d
}

func TestOpenLane(t *testing.T) {
	t.Run("finds, enables and maps the device", func(t *testing.T) {
		root := t.TempDir()
		fakePCI(t, root, "0000:00:02.0", "0x1af4", "0x1003", true, 0) // virtio-serial
		d := fakePCI(t, root, "0000:00:05.0", laneVendor, laneDevice, false, 1<<20)
		l, err := openLane(root)
		if err != nil {
			t.Fatal(err)
		}
		if len(l.Bytes()) != 1<<20 {
			t.Fatalf("mapped %d bytes, want the BAR's %d", len(l.Bytes()), 1<<20)
		}
		if readTrim(filepath.Join(d, "enable")) != "1" {
			t.Fatal("the device was not enabled")
		}
		// Writes reach the BAR's memory; reads past it fail.
		if _, err := l.WriteAt([]byte("lane"), 1<<20-4); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(d, laneBAR))
		if string(b[len(b)-4:]) != "lane" {
			t.Fatalf("the BAR holds %q", b[len(b)-4:])
		}
		if _, err := l.ReadAt(make([]byte, 8), 1<<20-4); err == nil {
			t.Fatal("a read past the BAR succeeded")
		}
	})
	t.Run("no device", func(t *testing.T) {
		root := t.TempDir()
		fakePCI(t, root, "0000:00:02.0", "0x1af4", "0x1003", true, 0)
		if _, err := openLane(root); !errors.Is(err, errNoLane) {
			t.Fatalf("err = %v, want errNoLane", err)
		}
	})
	t.Run("a BAR that cannot be opened", func(t *testing.T) {
		root := t.TempDir()
		fakePCI(t, root, "0000:00:05.0", laneVendor, laneDevice, true, 0)
		if _, err := openLane(root); err == nil || errors.Is(err, errNoLane) {
			t.Fatalf("err = %v, want an error naming the lane's memory", err)
		}
	})
}
