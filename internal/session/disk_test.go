package session

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine/fake"
	"github.com/nethersandbox/nether/internal/meter"
	"github.com/nethersandbox/nether/internal/snapshot"
)

// A wake trusts the park's stamp of its disk only while the stamp is
// exactly the file's; any change moves the ctime and brings back the full
// comparison of checksums, which refuses what changed and accepts what
// did not. validate_snapshot never trusts the stamp.
func TestParkedDiskStamp(t *testing.T) {
	ctx := context.Background()
	newDisk := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "disk.img")
		b := make([]byte, 3*snapshot.ChunkSize)
		for i := range b {
			b[i] = byte(i * 7)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	park := func(t *testing.T, p string) diskSection {
		t.Helper()
		sec, err := parkedDisk(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if sec.Stamp == nil {
			t.Fatal("the park recorded no stamp of an untouched disk")
		}
		return sec
	}
	// Past the coarse clock's tick of the park's stamp.
	later := func() { time.Sleep(60 * time.Millisecond) }

	t.Run("an untouched disk is known by its stamp", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		// Checksums that no longer match would refuse a full comparison:
		// passing says the stamp was trusted.
		sec.Chunks[1] ^= 1
		stamped, err := checkLiveDisk(ctx, sec, true)
		if err != nil || !stamped {
			t.Fatalf("stamped=%v err=%v, want the stamp trusted", stamped, err)
		}
		if _, err := checkLiveDisk(ctx, sec, false); err == nil || !strings.Contains(err.Error(), "chunk 1") {
			t.Fatalf("validate_snapshot's full comparison: %v, want chunk 1 named", err)
		}
	})

	t.Run("a touched but unchanged disk is compared in full and accepted", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		later()
		if err := os.Chmod(p, 0o640); err != nil {
			t.Fatal(err)
		}
		stamped, err := checkLiveDisk(ctx, sec, true)
		if err != nil || stamped {
			t.Fatalf("stamped=%v err=%v, want a full comparison that passes", stamped, err)
		}
	})

	t.Run("a changed disk is refused even with its mtime set back", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		later()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xff}, 2*snapshot.ChunkSize+5); err != nil {
			t.Fatal(err)
		}
		f.Close()
		if err := os.Chtimes(p, fi.ModTime(), fi.ModTime()); err != nil {
			t.Fatal(err)
		}
		if _, err := checkLiveDisk(ctx, sec, true); err == nil || !strings.Contains(err.Error(), "chunk 2") {
			t.Fatalf("err = %v, want chunk 2 named", err)
		}
	})

	t.Run("a disk written just before the park is stamped clear of the tick", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		if time.Now().Before(sec.Stamp.ClearAt()) {
			t.Fatalf("the stamp was taken %s after the disk's ctime, before it was clear of its tick", time.Since(time.Unix(0, sec.Stamp.CtimeNS)))
		}
	})

	t.Run("a park from before stamps is compared in full", func(t *testing.T) {
		p := newDisk(t)
		sec := park(t, p)
		sec.Stamp = nil
		if stamped, err := checkLiveDisk(ctx, sec, true); err != nil || stamped {
			t.Fatalf("stamped=%v err=%v", stamped, err)
		}
	})
}

// TestUnusableDiskEnds: a guest that could not mount its persistent disk
// ends the sandbox at once with reason=error and exit status 1, rather
// than run on refusing every command: the command that waited for the
// agent is refused naming the disk's host file and what is wrong with it,
// and nether's log says the same.
func TestUnusableDiskEnds(t *testing.T) {
	eng := fake.New(slog.Default())
	const problem = "is not a usable ext4 file system: the guest's kernel would not mount it (invalid argument): EXT4-fs (vdb): Invalid log block size: 4022250974"
	// The hello comes late enough for the client to be connected when
	// the sandbox ends on it (an instant one ended it before the dial).
	eng.SetFaults(fake.Faults{DiskProblem: problem, HelloAfter: time.Second})
	sb := start(t, eng, "", "disk = data.img\n")
	c := sb.dial()
	began := time.Now()
	_, exit, err := run(t, c, "echo hi")
	want := "the disk " + filepath.Join(sb.dir, "data.img") + " " + problem
	if err == nil || exit != -1 || !strings.Contains(err.Error(), want) {
		t.Fatalf("a command on a guest that could not mount its disk: exit %d, err %v; want an ERR with %q", exit, err, want)
	}
	sb.expectEnd(5*time.Second, 1, meter.ReasonError)
	t.Logf("refused and ended %s after the command was sent", time.Since(began).Round(time.Millisecond))
	if logs := sb.logs.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, want) {
		t.Errorf("nether's log does not name the disk and its fault:\n%s", logs)
	}
}
