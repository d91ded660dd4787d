package e2e

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// sqliteProbe creates a database, commits a row and reads it back with
// python3's sqlite3 module: the userland the default guest promises.
const sqliteProbe = `python3 -c 'import sqlite3, sys; ` +
	`con = sqlite3.connect(sys.argv[1]); con.execute("create table t(x)"); ` +
	`con.execute("insert into t values (42)"); con.commit(); ` +
	`print(con.execute("select x from t").fetchone()[0], sqlite3.sqlite_version)' `

var sqliteOut = regexp.MustCompile(`^42 3\.\d+\.\d+\n$`)

// TestDebianGuest: the default guest is Debian 12 with python3, sqlite3
// and a nether user, its commands get a normal environment, its root is
// the read-only image under a writable layer in memory, and python3 with
// sqlite3 works in a fresh boot and in a fork of the shared base.
func TestDebianGuest(t *testing.T) {
	t.Parallel()
	sb := start(t)
	c := sb.dial()
	if out := mustRun(t, c, ". /etc/os-release && echo $ID $VERSION_ID"); out != "debian 12\n" {
		t.Fatalf("os-release: %q, want debian 12", out)
	}
	if out := mustRun(t, c, sqliteProbe+"/tmp/fresh.db"); !sqliteOut.MatchString(out) {
		t.Fatalf("python3+sqlite3 in a fresh boot: %q", out)
	}
	if out := mustRun(t, c, `echo "$PATH|$HOME|$USER|$LANG|$TERM"`); !strings.Contains(out, "/usr/bin") || !strings.Contains(out, "|/root|root|C.UTF-8|") {
		t.Fatalf("environment: %q", out)
	}
	if out := mustRun(t, c, "id nether; ls -ld /home/nether | cut -d' ' -f1,3"); !strings.Contains(out, "uid=1000(nether) gid=1000(nether)") || !strings.Contains(out, "nether") {
		t.Fatalf("nether user: %q", out)
	}
	for _, tool := range []string{"bash", "sqlite3", "curl", "ip", "ps", "less", "mkfs.ext4"} {
		mustRun(t, c, "command -v "+tool)
	}
	// The root is the image under a tmpfs layer: writable everywhere,
	// and nothing of the initramfs is left.
	mustRun(t, c, "echo w > /etc/written && cat /etc/written && echo w > /usr/lib/written")
	if out := mustRun(t, c, "awk '$2 == \"/\" {print $3}' /proc/mounts"); out != "overlay\n" {
		t.Fatalf("root file system %q, want overlay", out)
	}
	if _, exit := run(t, c, "test -e /init"); exit == 0 {
		t.Fatal("/init of the initramfs is still visible in the root")
	}

	fork := forkOf(t, sharedBase(t))
	fc := fork.dial()
	if out := mustRun(t, fc, "cat /root/x"); out != "base\n" {
		t.Fatalf("fork's /root/x = %q, want the base's", out)
	}
	if out := mustRun(t, fc, sqliteProbe+"/root/fork.db"); !sqliteOut.MatchString(out) {
		t.Fatalf("python3+sqlite3 in a fork: %q", out)
	}
}

// TestBusyboxGuest: rootfs = busybox boots the initramfs alone, the
// smallest guest (with a persistent disk here: its ext4 modules are in the
// initramfs too); an artifact of the default guest does not restore into
// it, and the refusal names the root image.
func TestBusyboxGuest(t *testing.T) {
	t.Parallel()
	sb := start(t, "rootfs = busybox", "disk = data.img")
	c := sb.dial()
	if out := mustRun(t, c, "readlink /bin/sh; awk '$2 == \"/\" || $2 == \"/data\" {print $3}' /proc/mounts"); out != "busybox\nrootfs\next4\n" {
		t.Fatalf("busybox guest with a disk: %q", out)
	}
	if _, exit := run(t, c, "command -v python3"); exit == 0 {
		t.Fatal("python3 in the busybox guest")
	}

	refused := spawn(t, t.TempDir(), "rootfs = busybox", "restore = 1", "restore_from = "+sharedBase(t))
	refused.wait(30 * time.Second)
	if out := refused.stderr.String(); !strings.Contains(out, "rootfs_sha256=none (rootfs = busybox)") {
		t.Fatalf("restoring the default guest's base with rootfs = busybox: stderr lacks the refusal:\n%s", tail(out, 2000))
	}
}
