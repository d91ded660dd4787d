package session

import (
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/conf"
	"github.com/nethersandbox/nether/internal/engine/fake"
)

func TestFSTypeOf(t *testing.T) {
	at := func(off int, b ...byte) []byte {
		p := make([]byte, 4096)
		copy(p[off:], b)
		return p
	}
	le32 := func(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"erofs", at(1024, le32(0xE0F5E1E2)...), "erofs"},
		{"squashfs", at(0, 'h', 's', 'q', 's'), "squashfs"},
		{"ext4", at(1080, 0x53, 0xEF), "ext4"},
		{"zeros", make([]byte, 4096), ""},
		{"a cpio archive", []byte("070701000000000000"), ""},
		{"empty", nil, ""},
		{"erofs magic cut short", at(1024, 0xE2, 0xE1, 0xF5, 0xE0)[:1026], ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fsTypeOf(tc.b); got != tc.want {
				t.Fatalf("fsTypeOf = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRootImage(t *testing.T) {
	guest := t.TempDir()
	t.Run("busybox has none", func(t *testing.T) {
		p, err := RootImage(&conf.Config{Rootfs: conf.RootfsBusybox}, guest)
		if err != nil || p != "" {
			t.Fatalf("RootImage = %q, %v", p, err)
		}
	})
	t.Run("default missing says how to build it", func(t *testing.T) {
		_, err := RootImage(&conf.Config{}, guest)
		if err == nil || !strings.Contains(err.Error(), "scripts/setup.sh") || !strings.Contains(err.Error(), "rootfs = busybox") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("default present", func(t *testing.T) {
		want := filepath.Join(guest, RootImageFile)
		os.WriteFile(want, fakeErofs(""), 0o644)
		p, err := RootImage(&conf.Config{}, guest)
		if err != nil || p != want {
			t.Fatalf("RootImage = %q, %v; want %q", p, err, want)
		}
	})
	t.Run("a path", func(t *testing.T) {
		p, err := RootImage(&conf.Config{Rootfs: "/images/py.img"}, guest)
		if err != nil || p != "/images/py.img" {
			t.Fatalf("RootImage = %q, %v", p, err)
		}
	})
}

// TestRootImageRefusals: a file that is no root image is refused before
// anything boots, and a restore with another root image (or none) is
// refused naming rootfs_sha256.
func TestRootImageRefusals(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other.img")
	os.WriteFile(other, fakeErofs("another root"), 0o644)
	junk := filepath.Join(t.TempDir(), "junk.img")
	os.WriteFile(junk, []byte("not a file system"), 0o644)

	sb := start(t, fake.New(slog.Default()), "", "rootfs = "+junk+"\n")
	sb.expectEnd(5*time.Second, 1, "error")
	if want := "is not an erofs, squashfs or ext4 file system image"; !strings.Contains(sb.logs.String(), want) {
		t.Fatalf("log lacks %q", want)
	}

	base, _ := snapshotBase(t, fake.New(slog.Default()), "base")
	for _, tc := range []struct{ name, rootfs, want string }{
		{"another image", other, "rootfs_sha256="},
		{"no image", "busybox", "this nether has rootfs_sha256=none (rootfs = busybox)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := start(t, fake.New(slog.Default()), "", "rootfs = "+tc.rootfs+"\nrestore = 1\nrestore_from = "+base+"\n")
			sb.expectEnd(5*time.Second, 1, "error")
			if !strings.Contains(sb.logs.String(), tc.want) {
				t.Fatalf("restore log lacks %q", tc.want)
			}
		})
	}
}
