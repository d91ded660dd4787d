package disk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func needTools(t *testing.T) { needPackage(t, "e2fsprogs", "mke2fs", "debugfs") }

// needPackage skips a test without the programs of a Debian package,
// except in CI, where setup installs it.
func needPackage(t *testing.T, pkg string, progs ...string) {
	t.Helper()
	for _, p := range progs {
		if _, err := lookSbin(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is missing (CI is set: setup installs %s)", p, pkg)
			}
			t.Skipf("SKIPPING: %s is missing (install %s)", p, pkg)
		}
	}
}

// A new disk is created sparse, formatted ext4 with a world-writable
// root, and locked; the second Prepare of the same file is refused while
// the first holds it, and succeeds, without reformatting, once released.
func TestPrepareNewThenExisting(t *testing.T) {
	needTools(t)
	path := filepath.Join(t.TempDir(), "data.img")
	lock, info, err := Prepare(context.Background(), path, 16)
	if err != nil {
		t.Fatal(err)
	}
	if !info.Fresh || info.Format != Raw || info.Size != 16*MiB {
		t.Fatalf("info %+v", info)
	}
	st, _ := os.Stat(path)
	if st.Size() != 16*MiB {
		t.Fatalf("size %d", st.Size())
	}
	out, err := exec.Command(mustSbin(t, "debugfs"), "-R", "stat /", path).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Mode:  0777") {
		t.Fatalf("root directory of the new disk: %s %v", out, err)
	}
	if _, _, err := Prepare(context.Background(), path, 16); err == nil || !strings.Contains(err.Error(), "in use by another live sandbox") {
		t.Fatalf("second Prepare while locked: %v", err)
	}
	before, _ := os.ReadFile(path)
	lock.Close()
	lock2, info2, err := Prepare(context.Background(), path, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer lock2.Close()
	if info2.Fresh || info2.Size != 16*MiB {
		t.Fatalf("existing disk: %+v", info2)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Fatal("an existing disk was rewritten")
	}
}

func mustSbin(t *testing.T, p string) string {
	bin, err := lookSbin(p)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Every bad existing file is refused with its reason and left as it was.
func TestPrepareRefusesBadFiles(t *testing.T) {
	needTools(t)
	dir := t.TempDir()
	ext2 := filepath.Join(dir, "ext2.img")
	os.WriteFile(ext2, nil, 0o600)
	os.Truncate(ext2, 16*MiB)
	if out, err := exec.Command(mustSbin(t, "mke2fs"), "-q", "-F", "-t", "ext2", ext2).CombinedOutput(); err != nil {
		t.Fatalf("mke2fs: %s %v", out, err)
	}
	small := filepath.Join(dir, "small.img")
	lock, _, err := Prepare(context.Background(), small, 8)
	if err != nil {
		t.Fatal(err)
	}
	lock.Close()
	junk := filepath.Join(dir, "junk.img")
	os.WriteFile(junk, bytes.Repeat([]byte("not a disk "), 4096), 0o600)
	empty := filepath.Join(dir, "empty.img")
	os.WriteFile(empty, nil, 0o600)

	for _, tc := range []struct {
		name, path string
		sizeMB     int
		want       string
	}{
		{"not ext4", junk, 8, "is not an ext4 file system"},
		{"empty file", empty, 8, "is not an ext4 file system"},
		{"ext2", ext2, 8, "ext2 or ext3"},
		{"smaller than asked", small, 64, "holds 8 MiB and disk_size_mb asks for 64"},
		{"a directory", dir, 8, "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := os.ReadFile(tc.path)
			l, _, err := Prepare(context.Background(), tc.path, tc.sizeMB)
			if err == nil {
				l.Close()
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("error %q lacks %q or the path", err, tc.want)
			}
			if after, _ := os.ReadFile(tc.path); !bytes.Equal(before, after) {
				t.Fatal("the refused file was changed")
			}
		})
	}
}

// A disk that cannot be written is refused, not opened read-only.
func TestPrepareRefusesUnwritable(t *testing.T) {
	needTools(t)
	path := filepath.Join(t.TempDir(), "ro.img")
	lock, _, err := Prepare(context.Background(), path, 8)
	if err != nil {
		t.Fatal(err)
	}
	lock.Close()
	if os.Geteuid() == 0 {
		// Root writes through mode bits; the immutable attribute stops
		// even root.
		if out, err := exec.Command("chattr", "+i", path).CombinedOutput(); err != nil {
			t.Fatalf("chattr +i: %s %v", out, err)
		}
		defer exec.Command("chattr", "-i", path).Run()
	} else {
		os.Chmod(path, 0o400)
	}
	if _, _, err := Prepare(context.Background(), path, 8); err == nil || !strings.Contains(err.Error(), "cannot be opened for writing") {
		t.Fatalf("unwritable disk: %v", err)
	}
}

// A new disk whose directory does not exist is an error naming it, and
// a failed format leaves no file behind.
func TestPrepareCreateFails(t *testing.T) {
	needTools(t)
	path := filepath.Join(t.TempDir(), "missing", "data.img")
	if _, _, err := Prepare(context.Background(), path, 8); err == nil || !strings.Contains(err.Error(), "creating disk") {
		t.Fatalf("disk in a missing directory: %v", err)
	}
	// mke2fs refuses a file system this small: the new file goes.
	tiny := filepath.Join(t.TempDir(), "tiny.img")
	if _, _, err := Prepare(context.Background(), tiny, 0); err == nil {
		t.Fatal("a 0 MiB disk was formatted")
	}
	if _, err := os.Stat(tiny); !os.IsNotExist(err) {
		t.Fatalf("a failed format left %s behind: %v", tiny, err)
	}
}

// sniff on headers alone: qcow2's virtual size, ext4 against ext3.
func TestSniff(t *testing.T) {
	dir := t.TempDir()
	q := make([]byte, 2048)
	copy(q, qcow2Magic)
	q[24+3] = 1 // 1<<32 bytes, big-endian
	p := filepath.Join(dir, "q")
	os.WriteFile(p, q, 0o600)
	f, _ := os.Open(p)
	defer f.Close()
	format, size, err := sniff(f)
	if err != nil || format != QCOW2 || size != 1<<32 {
		t.Fatalf("qcow2: %s %d %v", format, size, err)
	}
}

// FuzzSniff: any first bytes of a file are classified or refused, never
// a panic, and a qcow2 or ext4 answer has the magic it claims.
func FuzzSniff(f *testing.F) {
	q := make([]byte, 64)
	copy(q, qcow2Magic)
	f.Add(q)
	e := make([]byte, sbOffset+0x68)
	e[sbOffset+sbMagicOff], e[sbOffset+sbMagicOff+1] = 0x53, 0xEF
	f.Add(e)
	f.Add([]byte("not a disk"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "d")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		fd, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer fd.Close()
		format, _, err := sniff(fd)
		switch {
		case err != nil:
		case format == QCOW2 && !bytes.HasPrefix(b, []byte(qcow2Magic)):
			t.Fatalf("qcow2 without its magic: %q", b[:min(8, len(b))])
		case format == Raw && (len(b) < sbOffset+0x68 || b[sbOffset+sbMagicOff] != 0x53):
			t.Fatal("ext4 without its superblock magic")
		}
	})
}
