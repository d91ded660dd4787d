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

// An ext4 disk whose superblock the kernel would refuse (written over,
// or the file cut short) is refused before any boot, saying what is wrong
// and that nether never repairs it, and left as it was.
func TestPrepareRefusesDamagedSuperblock(t *testing.T) {
	needTools(t)
	dir := t.TempDir()
	fresh := func(t *testing.T, name string, mkfs ...string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		os.WriteFile(path, nil, 0o600)
		os.Truncate(path, 16*MiB)
		args := append([]string{"-q", "-F", "-t", "ext4"}, mkfs...)
		if out, err := exec.Command(mustSbin(t, "mke2fs"), append(args, path)...).CombinedOutput(); err != nil {
			t.Fatalf("mke2fs: %s %v", out, err)
		}
		return path
	}
	write := func(t *testing.T, path string, off int64, b []byte) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T) string
		want   string
	}{
		{"counts written over", func(t *testing.T) string {
			p := fresh(t, "counts.img")
			write(t, p, sbOffset, bytes.Repeat([]byte{0xde, 0xad}, 0x18))
			return p
		}, "superblock's checksum is"},
		{"checksum type written over", func(t *testing.T) string {
			p := fresh(t, "type.img")
			write(t, p, sbOffset+sbChecksumType, []byte{7})
			return p
		}, "names checksum type 7, not crc32c"},
		{"truncated", func(t *testing.T) string {
			p := fresh(t, "cut.img")
			os.Truncate(p, 12*MiB)
			return p
		}, "counts 16384 blocks of 1024 bytes (16 MiB), the file holds 12 MiB (truncated?)"},
		{"cut inside its superblock", func(t *testing.T) string {
			p := fresh(t, "tiny.img")
			os.Truncate(p, 1500)
			return p
		}, "the file ends at byte 1500, inside its superblock"},
		{"block size written over, no checksums", func(t *testing.T) string {
			p := fresh(t, "bs.img", "-O", "^metadata_csum")
			write(t, p, sbOffset+sbLogBlockSize, []byte{0xee, 0xff, 0, 0})
			return p
		}, "block size (log 65518) is out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.damage(t)
			before, _ := os.ReadFile(path)
			l, _, err := Prepare(context.Background(), path, 8)
			if err == nil {
				l.Close()
				t.Fatal("accepted")
			}
			for _, w := range []string{"the disk " + path + " is not a usable ext4 file system: ", tc.want, NeverRepairs} {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Fatal("the refused file was changed")
			}
		})
	}
	// The same superblocks undamaged, 64BIT's high block count word
	// included, are accepted.
	for _, mkfs := range [][]string{nil, {"-O", "^metadata_csum"}, {"-O", "64bit", "-b", "4096"}} {
		p := fresh(t, "ok.img", mkfs...)
		l, _, err := Prepare(context.Background(), p, 8)
		if err != nil {
			t.Fatalf("an undamaged disk (mke2fs %v): %v", mkfs, err)
		}
		l.Close()
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
// a panic, and a qcow2 or ext4 answer has the magic it claims (and an
// ext4 one a whole superblock the kernel would mount). The corpus holds
// the first 2 KiB of a real mke2fs image (ext4_superblock).
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
		case format == Raw && (len(b) < sbOffset+sbLen || b[sbOffset+sbMagicOff] != 0x53):
			t.Fatal("ext4 without its superblock magic, or with part of a superblock")
		case format == Raw && checkSuperblock(b[sbOffset:sbOffset+sbLen], int64(len(b))) != nil:
			t.Fatal("ext4 with a superblock the kernel would refuse")
		}
	})
}
