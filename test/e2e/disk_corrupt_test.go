package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// corruptEndWithin bounds how long nether may take, from its start, to end
// on a disk its guest cannot mount: a cold boot under TCG (2-4 s here, and
// more on a loaded machine), then the end within milliseconds of the
// guest's hello. Before the fix nether ran on forever, refusing every
// command.
const corruptEndWithin = 60 * time.Second

// hostRefusalWithin bounds the end of a nether whose disk the host's own
// check refuses: no guest boots.
const hostRefusalWithin = 10 * time.Second

// TestDiskCorrupt: a sandbox restarted on a disk that was damaged while
// it was stopped (its superblock or inode table scribbled over, the file
// truncated, a fork layer's backing file scribbled over or truncated)
// ends by itself, soon, with exit status 1 and reason=error, its log
// naming the disk and what is wrong. What the host checks (a raw disk's
// superblock) is refused before any boot; what only the guest's kernel
// sees ends the sandbox at the guest's hello, and the command that waited
// for the guest is answered with an ERR saying the same. The damaged file
// is left as it was.
func TestDiskCorrupt(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.img")
	sb := start(t, "disk = "+good, "ram_mb = 256")
	c := sb.dial()
	began := time.Now()
	mustRun(t, c, "echo kept > /data/x && sync")
	t.Logf("a healthy cold boot on the disk answered its first command %s after the socket listened", time.Since(began).Round(100*time.Millisecond))
	base := takeSnapshot(t, sb, c, "cbase")
	shutdown(t, sb, c)

	// A fork of the base, stopped once it answers: its layer holds
	// nothing of its own, so every block of its disk reads through to
	// the base's.
	f := forkOf(t, base, "ram_mb = 256")
	fc := f.dial()
	mustRun(t, fc, "cat /data/x")
	shutdown(t, f, fc)
	forkLayer := filepath.Join(f.dir, "disk.qcow2")

	bs, itable := ext4Layout(t, good)
	cases := []struct {
		name   string
		conf   []string
		damage func(t *testing.T, path string)
		qcow2  bool
		host   bool // refused by the host's check, before any boot
	}{
		// The superblock's counts, before its magic: the host still
		// sees an ext4 superblock; its checksum no longer holds.
		{name: "superblock", host: true, damage: func(t *testing.T, p string) { scribble(t, p, 1024, 0x30) }},
		// The first blocks of group 0's inode table: the root
		// directory's inode and the journal's.
		{name: "inode table", damage: func(t *testing.T, p string) { scribble(t, p, itable*bs, 4*bs) }},
		// Half the file gone.
		{name: "truncated", host: true, damage: func(t *testing.T, p string) { truncateTo(t, p, 32<<20) }},
		// A fork's layer over a base disk whose superblock was
		// scribbled over (written through qemu-io at the guest's
		// offset, as a stray writer of the image would).
		{name: "fork layer, backing scribbled", qcow2: true, damage: func(t *testing.T, _ string) {
			qemuIOScribble(t, filepath.Join(base, "disk"), 1024, 0x30)
		}},
		// ... and one whose backing file lost its data clusters.
		{name: "fork layer, backing truncated", qcow2: true, damage: func(t *testing.T, _ string) {
			truncateTo(t, filepath.Join(base, "disk"), 4*65536)
		}},
	}
	pristineBase := copyDir(t, base)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "data.img")
			if tc.qcow2 {
				// The fork's layer, over a damaged copy of the base.
				restoreDir(t, pristineBase, base)
				copyFile(t, forkLayer, path)
			} else {
				copyFile(t, good, path)
			}
			tc.damage(t, path)
			damaged := filepath.Join(t.TempDir(), "damaged")
			copyFile(t, path, damaged)
			backingSum := fileSHA(t, filepath.Join(base, "disk"))

			want := "the disk " + path + " is not a usable ext4 file system"
			conf := append([]string{"disk = " + path, "ram_mb = 256"}, tc.conf...)
			var (
				sb    *sandbox
				line  string
				began = time.Now()
			)
			if tc.host {
				sb = spawn(t, t.TempDir(), conf...)
				line = sb.wait(hostRefusalWithin)
				if strings.Contains(sb.stderr.String(), "guest starting") {
					t.Error("a guest booted on a disk the host's check refuses")
				}
			} else {
				sb = start(t, conf...)
				body, exit := run(t, sb.dial(), "cat /data/x")
				if exit == 0 || !strings.Contains(body, want) {
					t.Errorf("a command on the damaged disk: %q exit %d; want an ERR naming the disk and what is wrong", body, exit)
				}
				t.Logf("the command's reply: %s", body)
				line = sb.wait(corruptEndWithin)
			}
			took := time.Since(began)
			t.Logf("nether ended %s after its start: %s", took.Round(100*time.Millisecond), line)
			if !strings.Contains(line, "(reason=error)") || sb.h.ExitCode() != 1 {
				t.Errorf("final line %q, exit %d; want reason=error, exit 1", line, sb.h.ExitCode())
			}
			if log := sb.stderr.String(); !strings.Contains(log, "level=ERROR") || !strings.Contains(log, want) {
				t.Errorf("nether's log does not name the disk and its fault:\n%s", tail(log, 3000))
			}
			sb.checkNoLeftovers()
			// The guest's kernel may note the error it found in the
			// superblock, as ext4 does (e2fsck reads it); nothing
			// else is written.
			if off, ok := sameOutsideSuperblock(t, damaged, path); !ok {
				t.Errorf("the failed start changed the damaged disk at byte %d", off)
			}
			if fileSHA(t, filepath.Join(base, "disk")) != backingSum {
				t.Error("the failed start changed the fork layer's backing file")
			}
		})
	}
}

// ext4Layout reads the block size and group 0's first inode table block
// of an ext4 image.
func ext4Layout(t *testing.T, path string) (bs, itable int64) {
	t.Helper()
	out, err := exec.Command("/sbin/dumpe2fs", path).Output()
	if err != nil {
		t.Fatalf("dumpe2fs %s: %v", path, err)
	}
	bsRE := regexp.MustCompile(`(?m)^Block size:\s+(\d+)$`)
	itRE := regexp.MustCompile(`(?m)^\s+Inode table at (\d+)-`)
	m, n := bsRE.FindSubmatch(out), itRE.FindSubmatch(out)
	if m == nil || n == nil {
		t.Fatalf("dumpe2fs %s: no block size or inode table in\n%s", path, out)
	}
	bs, _ = strconv.ParseInt(string(m[1]), 10, 64)
	itable, _ = strconv.ParseInt(string(n[1]), 10, 64)
	return bs, itable
}

// sameOutsideSuperblock compares two files byte for byte, but for the
// primary ext4 superblock (bytes 1024 to 2047), and returns the first
// offset where they differ.
func sameOutsideSuperblock(t *testing.T, a, b string) (int64, bool) {
	t.Helper()
	x, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	y, err := os.ReadFile(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range min(len(x), len(y)) {
		if x[i] != y[i] && (i < 1024 || i >= 2048) {
			return int64(i), false
		}
	}
	return int64(min(len(x), len(y))), len(x) == len(y)
}

// garbage is n bytes that are no file system's metadata.
func garbage(n int64) []byte {
	return bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0x5a, 0xa5, 0x13, 0x37}, int(n+7)/8)[:n]
}

// scribble writes n bytes of garbage at off.
func scribble(t *testing.T, path string, off, n int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(garbage(n), off); err != nil {
		t.Fatal(err)
	}
}

// qemuIOScribble writes n bytes of garbage at the guest offset off of a
// qcow2 image, wherever in the file that offset's cluster lives.
func qemuIOScribble(t *testing.T, path string, off, n int64) {
	t.Helper()
	// qemu-io writes a pattern, not bytes of ours: 0xde over the range.
	cmd := exec.Command("qemu-io", "-f", "qcow2", "-c", "write -P 0xde "+strconv.FormatInt(off, 10)+" "+strconv.FormatInt(n, 10), path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("qemu-io write into %s: %v\n%s", path, err, out)
	}
}

func truncateTo(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", "--sparse=always", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp %s %s: %v %s", src, dst, err, out)
	}
}

// copyDir copies dir aside and returns the copy.
func copyDir(t *testing.T, dir string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(dir))
	if out, err := exec.Command("cp", "-a", "--sparse=always", dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s: %v %s", dir, err, out)
	}
	return dst
}

// restoreDir puts dir back as its copy holds it.
func restoreDir(t *testing.T, copy, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--sparse=always", copy, dir).CombinedOutput(); err != nil {
		t.Fatalf("cp -a %s: %v %s", copy, err, out)
	}
}
