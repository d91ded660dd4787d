package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

// sqliteInsert commits rows 1..n into a table of db, one transaction.
func sqliteInsert(db string, n int) string {
	return fmt.Sprintf(`python3 -c 'import sqlite3; con = sqlite3.connect("%s"); `+
		`con.execute("create table if not exists t(x)"); `+
		`con.executemany("insert into t values (?)", [(i,) for i in range(1, %d)]); con.commit(); print("committed")'`, db, n+1)
}

func sqliteCount(db string) string {
	return fmt.Sprintf(`python3 -c 'import sqlite3; print(sqlite3.connect("%s").execute("select count(*), sum(x) from t").fetchone())'`, db)
}

func fileSHA(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// allocated is the bytes a file takes on the host's disk.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestDiskAndRunAs: a fresh disk = with run_as = nether. Commands run as
// uid 1000 with the user's environment; /etc is closed to them and /tmp,
// $HOME and /data are open; __put__ writes files the user owns and cannot
// reach what the user cannot. A second sandbox on the same disk is
// refused at start. A SQLite commit on /data survives kill -9 of nether
// and QEMU and a restart with the same disk. Forks of its base inherit
// run_as and its disk; a fork that would widen run_as is refused.
func TestDiskAndRunAs(t *testing.T) {
	dir := t.TempDir()
	diskPath := filepath.Join(dir, "data.img")
	sb := start(t, "run_as = nether", "disk = "+diskPath)
	c := sb.dial()
	if info := sb.info(c); info["run_as"] != "nether" || info["disk"] != diskPath {
		t.Fatalf("__info__ run_as=%q disk=%q", info["run_as"], info["disk"])
	}
	if out := mustRun(t, c, `id -u; id -un; id -G; echo "$HOME $USER $LOGNAME $LANG"; pwd`); out != "1000\nnether\n1000\n/home/nether nether nether C.UTF-8\n/home/nether\n" {
		t.Fatalf("identity and environment of a run_as command: %q", out)
	}
	if out, exit := run(t, c, "touch /etc/written"); exit == 0 {
		t.Fatalf("run_as nether wrote /etc: %q", out)
	}
	if out := mustRun(t, c, "echo a > /tmp/a && echo b > ~/b && echo c > /data/c && cat /tmp/a ~/b /data/c && stat -c '%a %U' /data /data/c"); out != "a\nb\nc\n777 root\n644 nether\n" {
		t.Fatalf("/tmp, $HOME and /data as nether: %q", out)
	}
	if out := mustRun(t, c, "awk '$2 == \"/data\" {print $3, $4}' /proc/mounts"); !strings.HasPrefix(out, "ext4 rw,sync,") {
		t.Fatalf("/data is mounted %q, want ext4 rw,sync", out)
	}
	os.WriteFile(filepath.Join(sb.dir, "in.txt"), []byte("from the host\n"), 0o644)
	if body, exit := run(t, c, "__put__ in.txt /home/nether/put.txt"); exit != 0 {
		t.Fatalf("__put__ into the user's home: %q %d", body, exit)
	}
	if out := mustRun(t, c, "stat -c %U:%G /home/nether/put.txt; cat /home/nether/put.txt"); out != "nether:nether\nfrom the host\n" {
		t.Fatalf("a put file as nether: %q", out)
	}
	for _, line := range []string{"__put__ in.txt /etc/evil", "__put__ in.txt /root/evil", "__get__ /etc/shadow shadow.out"} {
		if body, exit := run(t, c, line); exit == 0 || !strings.Contains(body, "permission denied") {
			t.Errorf("%s as nether: %q exit %d, want permission denied", line, body, exit)
		}
	}
	if _, err := os.Stat(filepath.Join(sb.dir, "shadow.out")); err == nil {
		t.Error("__get__ of /etc/shadow as nether wrote a host file")
	}

	// The database, then a base of this sandbox for the forks below.
	if out := mustRun(t, c, sqliteInsert("/data/app.db", 100)); out != "committed\n" {
		t.Fatalf("sqlite insert: %q", out)
	}
	base := takeSnapshot(t, sb, c, "nbase")

	// A second live sandbox on the same disk is refused before it boots.
	second := spawn(t, t.TempDir(), "disk = "+diskPath)
	second.wait(30 * time.Second)
	if code := second.h.ExitCode(); code == 0 || !strings.Contains(second.stderr.String(), "in use by another live sandbox") {
		t.Fatalf("a second sandbox on %s: exit %d, stderr:\n%s", diskPath, code, tail(second.stderr.String(), 2000))
	}

	// kill -9 of nether and of QEMU right after the commit.
	mustRun(t, c, sqliteInsert("/data/app.db", 10))
	q := sb.qemu()
	sb.h.Signal(syscall.SIGKILL)
	q.Signal(syscall.SIGKILL)
	if err := sb.h.Wait(10 * time.Second); err != nil {
		t.Fatalf("nether survived SIGKILL: %v", err)
	}
	for began := time.Now(); q.Alive(); time.Sleep(10 * time.Millisecond) {
		if time.Since(began) > 5*time.Second {
			t.Fatalf("QEMU survived SIGKILL: %s", q)
		}
	}
	again := start(t, "disk = "+diskPath, "disk_size_mb = 32")
	ac := again.dial()
	if out := mustRun(t, ac, sqliteCount("/data/app.db")); out != "(110, 5105)\n" {
		t.Fatalf("after kill -9 and a restart the database holds %q, want (110, 5105)", out)
	}
	if out := mustRun(t, ac, "id -u; stat -c %U /data/c"); out != "0\nnether\n" {
		t.Fatalf("restart as root: %q", out)
	}
	shutdown(t, again, ac)

	t.Run("fork inherits run_as and the disk", func(t *testing.T) {
		f := forkOf(t, base)
		fc := f.dial()
		if out := mustRun(t, fc, "id -u; cat /data/c; "+sqliteCount("/data/app.db")); out != "1000\nc\n(100, 5050)\n" {
			t.Fatalf("fork of the run_as base: %q", out)
		}
		if info := f.info(fc); info["run_as"] != "nether" {
			t.Errorf("__info__ run_as=%q", info["run_as"])
		}
	})
	t.Run("fork may not widen run_as", func(t *testing.T) {
		for _, ask := range []string{"root", "other"} {
			sb := spawn(t, t.TempDir(), "restore = 1", "restore_from = "+base, "run_as = "+ask)
			sb.wait(30 * time.Second)
			if code, errOut := sb.h.ExitCode(), sb.stderr.String(); code == 0 || !strings.Contains(errOut, "runs commands as nether") || !strings.Contains(errOut, "never") {
				t.Fatalf("fork with run_as = %s: exit %d, stderr:\n%s", ask, code, tail(errOut, 2000))
			}
		}
	})
	t.Run("fork of a root base narrows", func(t *testing.T) {
		f := forkOf(t, sharedBase(t), "run_as = nether")
		fc := f.dial()
		if out := mustRun(t, fc, "id -u; echo $HOME"); out != "1000\n/home/nether\n" {
			t.Fatalf("narrowed fork: %q", out)
		}
		if _, exit := run(t, fc, "cat /root/x"); exit == 0 {
			t.Fatal("the narrowed fork read root's /root/x")
		}
		// The console's login shell was root's in the base: the fork
		// restarts it as the user.
		if out := mustRun(t, fc, "for i in $(seq 100); do u=$(ps -o user= -t ttyS0 | sort -u | tr -d ' \\n'); [ \"$u\" = nether ] && break; sleep 0.1; done; echo $u"); out != "nether\n" {
			t.Errorf("the narrowed fork's console shell runs as %q, want nether", out)
		}
	})
}

// TestRunAsUnknownUser: a run_as user the guest does not know refuses
// every command, saying so, rather than running it as root.
func TestRunAsUnknownUser(t *testing.T) {
	t.Parallel()
	sb := start(t, "run_as = nosuchuser")
	c := sb.dial()
	body, exit := run(t, c, "id -u")
	if exit == 0 || !strings.Contains(body, "nosuchuser") || !strings.Contains(body, "no such user") {
		t.Fatalf("a command with run_as = nosuchuser: %q exit %d", body, exit)
	}
}

// TestDiskForks: four forks of a base with a disk each write /data/me
// into a layer of their own while the parent's disk file stays
// byte-identical and the artifact intact; none sees another's write, nor
// what the parent wrote after the capture. A fork of a fork sees its
// parent's disk, a park continues its disk on wake, and an altered or
// missing layer is refused.
func TestDiskForks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	diskPath := filepath.Join(dir, "data.img")
	sb := start(t, "disk = "+diskPath, "disk_size_mb = 256")
	c := sb.dial()
	mustRun(t, c, "echo base > /data/shared && head -c 8388608 /dev/urandom > /data/blob && sha256sum /data/blob > /data/blob.sum")
	base := takeSnapshot(t, sb, c, "dbase")
	mustRun(t, c, "echo after > /data/parent")
	// The guest reads its root image after the capture as before.
	if out := mustRun(t, c, "python3 -c pass && ls -R /usr/lib/python3.11 >/dev/null && dmesg | grep -i 'i/o error' || true"); out != "" {
		t.Errorf("the parent's kernel after the capture: %q", out)
	}
	shutdown(t, sb, c)
	parentSum := fileSHA(t, diskPath)
	layerSum := fileSHA(t, filepath.Join(base, "disk"))
	mustValidate(t, base, "base")
	t.Logf("artifact disk layer: %d MiB allocated for a 256 MiB disk holding 8 MiB", allocated(t, filepath.Join(base, "disk"))>>20)

	forks := make([]*sandbox, 4)
	clients := make([]*client.Client, len(forks))
	var wg sync.WaitGroup
	for i := range forks {
		forks[i] = forkOf(t, base)
		clients[i] = forks[i].dial()
	}
	errs := make([]string, len(forks))
	for i := range forks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fc := clients[i]
			out, exit := run(t, fc, fmt.Sprintf("cat /data/shared; test -e /data/parent && echo parent-visible; cd /data && sha256sum -c --quiet blob.sum && echo fork-%d > /data/me && sync && echo ok", i))
			if exit != 0 || out != "base\nok\n" {
				errs[i] = fmt.Sprintf("fork %d: %q exit %d", i, out, exit)
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Error(e)
		}
	}
	for i, f := range forks {
		if out := mustRun(t, clients[i], "cat /data/me"); out != fmt.Sprintf("fork-%d\n", i) {
			t.Errorf("fork %d reads /data/me = %q: another fork's write reached it", i, out)
		}
		layer := filepath.Join(f.dir, "disk.qcow2")
		if n := allocated(t, layer); n > 4<<20 {
			t.Errorf("fork %d's layer takes %d KiB on the host for a few bytes written", i, n>>10)
		} else {
			t.Logf("fork %d's layer: %d KiB", i, n>>10)
		}
	}
	if fileSHA(t, diskPath) != parentSum {
		t.Error("the parent's disk file changed while its forks ran")
	}
	if fileSHA(t, filepath.Join(base, "disk")) != layerSum {
		t.Error("the artifact's disk layer changed while its forks ran")
	}

	// A transfer never replaces the layer a fork is writing.
	if body, exit := run(t, clients[0], "__get__ /data/me disk.qcow2"); exit == 0 {
		t.Errorf("__get__ onto the fork's own disk layer: %q", body)
	}

	// A fork of a fork: its base's layer holds fork 0's disk.
	f0, f0c := forks[0], clients[0]
	f0art := takeSnapshot(t, f0, f0c, "f0")
	mustRun(t, f0c, "echo fork-0-later > /data/me")
	g := forkOf(t, f0art)
	gc := g.dial()
	if out := mustRun(t, gc, "cat /data/me /data/shared; echo grandchild > /data/me"); out != "fork-0\nbase\n" {
		t.Errorf("a fork of a fork reads %q", out)
	}
	if out := mustRun(t, f0c, "cat /data/me"); out != "fork-0-later\n" {
		t.Errorf("fork 0 after its own fork wrote: %q", out)
	}

	// A park continues its own disk on wake.
	f1, f1c := forks[1], clients[1]
	mustRun(t, f1c, "echo before-park > /data/park")
	if body, exit := run(t, f1c, "__park__ p"); exit != 0 || !strings.HasPrefix(body, "OK parked p") {
		t.Fatalf("__park__: %q exit %d", body, exit)
	}
	f1.wait(30 * time.Second)
	park := filepath.Join(f1.dir, "p")
	mustValidate(t, park, "park")
	w := restoreIn(t, t.TempDir(), park)
	wc := w.dial()
	if out := mustRun(t, wc, "cat /data/me /data/park; echo after-wake >> /data/park; cat /data/park"); out != "fork-1\nbefore-park\nbefore-park\nafter-wake\n" {
		t.Errorf("the woken sandbox's disk: %q", out)
	}
	if info := w.info(wc); info["disk"] != filepath.Join(f1.dir, "disk.qcow2") {
		t.Errorf("the woken sandbox's disk is %q, want the parked fork's layer", info["disk"])
	}

	t.Run("damaged layers are refused", func(t *testing.T) {
		altered := filepath.Join(t.TempDir(), "altered")
		if out, err := exec.Command("cp", "-a", base, altered).CombinedOutput(); err != nil {
			t.Fatalf("cp: %s %v", out, err)
		}
		flipByte(t, filepath.Join(altered, "disk"))
		if out, errOut, code := validate(t, altered); code == 0 || !strings.Contains(errOut, "disk chunk") {
			t.Errorf("validate_snapshot of an altered disk layer: exit %d %q %q", code, out, errOut)
		}
		if errOut := restoreMustFail(t, altered); !strings.Contains(errOut, "disk chunk") {
			t.Errorf("restore of an altered disk layer: %s", tail(errOut, 1500))
		}
		os.Remove(filepath.Join(altered, "disk"))
		if _, errOut, code := validate(t, altered); code == 0 || !strings.Contains(errOut, "disk is missing") {
			t.Errorf("validate_snapshot of a missing disk layer: exit %d %q", code, errOut)
		}
	})
	t.Run("a restore cannot add a disk", func(t *testing.T) {
		sb := spawn(t, t.TempDir(), "restore = 1", "restore_from = "+sharedBase(t), "disk = extra.img")
		sb.wait(30 * time.Second)
		if errOut := sb.stderr.String(); sb.h.ExitCode() == 0 || !strings.Contains(errOut, "captured without a persistent disk") {
			t.Errorf("restore with a disk of a diskless base: %s", tail(errOut, 1500))
		}
	})
}

// flipByte inverts one byte of the file's data (its first allocated
// byte past the header).
func flipByte(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	off := st.Size() - 1
	b := make([]byte, 1)
	f.ReadAt(b, off)
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}
