package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// nxDisk is what TestNexusDisk reads of a sandbox record.
type nxDisk struct {
	ID, Name, State, Snapshot, Disk string
	Config                          struct {
		RunAs      string `json:"run_as"`
		DiskSizeMB int    `json:"disk_size_mb"`
	}
}

func (x *nx) inspectDisk(ref string) nxDisk {
	x.t.Helper()
	var sb nxDisk
	if err := json.Unmarshal([]byte(x.must("inspect", ref)), &sb); err != nil {
		x.t.Fatal(err)
	}
	return sb
}

// TestNexusDisk: nexus passes nether's guest settings through. A sandbox
// created with a disk and run_as runs its commands as that user; its
// /data survives stop and start (the same disk.img in its directory);
// each child of a fork starts from the parent's disk in a layer of its
// own, sees none of its siblings' writes, and leaves the parent's disk as
// it was; a child's layer survives its own stop and start; bad settings
// and a widening of run_as are refused before anything runs.
func TestNexusDisk(t *testing.T) {
	t.Parallel()
	x := newNexus(t)
	t0 := time.Now()
	step := func(what string) {
		t.Logf("%-34s %6.1f s", what, time.Since(t0).Seconds())
	}

	// Refused before anything runs: exit 2, the setting named, no record.
	x.refused(2, []string{"create", "--name", "bad", "--run-as", "Bob"}, "run_as Bob", "is not a user name")
	x.refused(2, []string{"create", "--name", "bad", "--disk-size-mb", "4"}, "disk_size_mb 4", "out of range (8..1048576)")
	x.refused(2, []string{"create", "--name", "bad", "--rootfs", "/nonexistent/rootfs.img"}, "/nonexistent/rootfs.img does not exist")
	if sbs := x.list(); len(sbs) != 0 {
		t.Fatalf("refused creates left records: %+v", sbs)
	}

	x.must("create", "--name", "dsk", "--ram-mb", "256", "--disk-size-mb", "32", "--run-as", "nether", "--start")
	step("create --start (a cold boot)")
	sb := x.inspectDisk("dsk")
	if want := filepath.Join(x.dir, "sandboxes", sb.ID, "disk.img"); sb.Disk != want || sb.Config.RunAs != "nether" || sb.Config.DiskSizeMB != 32 {
		t.Fatalf("the record: %+v; want disk %s, run_as nether, disk_size_mb 32", sb, want)
	}
	if out := x.must("exec", "dsk", "--", "id -u"); out != "1000\n" {
		t.Fatalf("id -u as run_as nether: %q", out)
	}
	x.must("exec", "dsk", "--", "echo parent > /data/x")
	if out := x.must("exec", "dsk", "--", "stat -c '%U %s' /data/x; df -m /data | tail -1 | tr -s ' ' | cut -d' ' -f2"); !strings.HasPrefix(out, "nether 7\n") {
		t.Errorf("/data/x as nether, and /data's size: %q", out)
	}

	// stop keeps the disk; start boots again on it.
	x.must("stop", "dsk")
	step("stop")
	if fi, err := os.Stat(sb.Disk); err != nil || fi.Size() != 32<<20 {
		t.Fatalf("after stop the disk: %v, %v", fi, err)
	}
	x.refused(3, []string{"snapshot", "create", "dsk"}, "sandbox dsk is stopped", "a stopped sandbox has no memory to capture", "its disk, if any, is kept")
	x.must("start", "dsk")
	step("start (a cold boot on the same disk)")
	if out := x.must("exec", "dsk", "--", "cat /data/x; id -u"); out != "parent\n1000\n" {
		t.Fatalf("after stop and start, /data/x and id -u: %q", out)
	}

	// fork -n 2: each child starts from the parent's disk, in its own
	// layer in its own directory.
	tf := time.Now()
	kids := ids(x.must("fork", "dsk", "-n", "2", "--name", "dk"))
	t.Logf("nexus fork -n 2 of a running sandbox with a 32 MiB disk took %s (its snapshot included)", time.Since(tf).Round(time.Millisecond))
	step("fork -n 2")
	if len(kids) != 2 {
		t.Fatalf("fork -n 2 printed %q", kids)
	}
	var snap string
	for _, name := range []string{"dk-1", "dk-2"} {
		k := x.inspectDisk(name)
		snap = k.Snapshot
		if want := filepath.Join(x.dir, "sandboxes", k.ID, "disk.qcow2"); k.Disk != want || k.Config.RunAs != "nether" {
			t.Errorf("%s: %+v; want disk %s, run_as nether", name, k, want)
		}
		if _, err := os.Stat(k.Disk); err != nil {
			t.Errorf("%s's layer: %v", name, err)
		}
		if out := x.must("exec", name, "--", "cat /data/x; id -u"); out != "parent\n1000\n" {
			t.Errorf("%s: /data/x and id -u: %q", name, out)
		}
		x.must("exec", name, "--", "echo "+name+" > /data/me")
	}
	for _, name := range []string{"dk-1", "dk-2"} {
		if out := x.must("exec", name, "--", "cat /data/me"); out != name+"\n" {
			t.Errorf("%s's /data/me: %q (a sibling's write?)", name, out)
		}
	}
	if out := x.must("exec", "dsk", "--", "cat /data/x; ls /data"); out != "parent\nlost+found\nx\n" {
		t.Errorf("the parent's /data after its children wrote theirs: %q", out)
	}

	// A widening of run_as is refused, before anything runs.
	x.refused(2, []string{"fork", snap, "--run-as", "root"}, "run_as = root", "runs commands as nether", "never widen it")
	x.refused(2, []string{"fork", "dsk", "--run-as", "bob"}, "never change it to another user")
	if n := len(x.list()); n != 3 {
		t.Errorf("refused forks changed the sandboxes: %d, want 3", n)
	}

	// A child's layer outlives its own stop and start.
	x.must("stop", "dk-1")
	x.must("start", "dk-1")
	step("a child's stop and start")
	if out := x.must("exec", "dk-1", "--", "cat /data/x /data/me"); out != "parent\ndk-1\n" {
		t.Errorf("dk-1 after stop and start: %q", out)
	}

	// A park keeps the disk where it is, and the wake continues it: here
	// a child's layer (nether's own tests wake on a plain disk).
	x.must("pause", "dk-2")
	x.must("resume", "dk-2")
	step("a child's pause and resume")
	if out := x.must("exec", "dk-2", "--", "cat /data/x /data/me"); out != "parent\ndk-2\n" {
		t.Errorf("dk-2 after pause and resume: %q", out)
	}

	// rm takes the disk with the sandbox.
	x.must("rm", "--force", "dk-1")
	if _, err := os.Stat(filepath.Dir(x.inspectDisk("dk-2").Disk)); err != nil {
		t.Errorf("rm of dk-1 touched dk-2: %v", err)
	}
	x.must("rm", "--force", "dsk")
	if _, err := os.Stat(sb.Disk); !os.IsNotExist(err) {
		t.Errorf("rm left the disk %s: %v", sb.Disk, err)
	}
	if out := x.must("exec", "dk-2", "--", "cat /data/x /data/me"); out != "parent\ndk-2\n" {
		t.Errorf("dk-2 after its parent's rm: %q", out)
	}
	step("done")
}

// TestNexusDiskCorrupt: a start on a disk damaged while the sandbox was
// stopped fails soon, with the reason (which disk, what is wrong), and
// the record goes to error, saying the same; rm still takes it away. The
// damage is one the host's check refuses before any boot (the
// superblock), and one only the guest's kernel finds (the inode table).
func TestNexusDiskCorrupt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, disk string)
	}{
		{"superblock", func(t *testing.T, disk string) { scribble(t, disk, 1024, 0x30) }},
		{"inode table", func(t *testing.T, disk string) {
			bs, itable := ext4Layout(t, disk)
			scribble(t, disk, itable*bs, 4*bs)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := newNexus(t)
			x.must("create", "--name", "cor", "--ram-mb", "256", "--disk-size-mb", "32", "--start")
			x.must("exec", "cor", "--", "echo kept > /data/x")
			x.must("stop", "cor")
			sb := x.inspectDisk("cor")
			tc.damage(t, sb.Disk)

			began := time.Now()
			want := "the disk " + sb.Disk + " is not a usable ext4 file system"
			x.refused(1, []string{"start", "cor"}, "sandbox cor: its nether ended while starting (reason=error): "+want)
			took := time.Since(began)
			t.Logf("nexus start on the damaged disk failed in %s", took.Round(100*time.Millisecond))
			if took > corruptEndWithin {
				t.Errorf("nexus start took %s to fail, want at most %s", took, corruptEndWithin)
			}
			rec := x.inspect("cor")
			t.Logf("the record: %s, reason %q", rec.State, rec.Reason)
			if rec.State != "error" || !strings.Contains(rec.Reason, want) {
				t.Errorf("after the failed start the record is %s, reason %q; want error, naming the disk", rec.State, rec.Reason)
			}
			if pids := nethersIn(filepath.Join(x.dir, "sandboxes")); len(pids) != 0 {
				t.Errorf("nethers still run: %v", pids)
			}
			x.must("rm", "cor")
			if sbs := x.list(); len(sbs) != 0 {
				t.Errorf("after rm: %+v", sbs)
			}
		})
	}
}
