package testharness

import (
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fakeNether writes a shell script standing in for nether: it starts two
// "QEMU" children (scripts whose name starts qemu-system, one with the
// probe's -machine none) and waits.
func fakeNether(t *testing.T) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	dir := t.TempDir()
	qemu := filepath.Join(dir, "qemu-system-test")
	// Not exec sleep, which would rename the process: the script keeps
	// its name and runs sleep as its child.
	if err := os.WriteFile(qemu, []byte("#!/bin/sh\nsleep 60\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	nether := filepath.Join(dir, "nether")
	script := "#!/bin/sh\n" + qemu + " -machine none &\n" + qemu + " -machine pc &\nwait\n"
	if err := os.WriteFile(nether, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return nether
}

func TestChildrenMachineAndSurvivors(t *testing.T) {
	sb, err := Start(Options{Bin: fakeNether(t), Conf: []string{"cpus = 1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range sb.Survivors() {
			p.Signal(syscall.SIGKILL)
		}
		sb.Close()
	})
	if b, err := os.ReadFile(filepath.Join(sb.Dir, "nether.conf")); err != nil || string(b) != "cpus = 1\n" {
		t.Fatalf("nether.conf = %q, %v", b, err)
	}
	m, err := sb.WaitMachine(10*time.Second, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if m.IsProbe() || !m.IsQEMU() || m.PPid != sb.Pid() || !slices.Contains(m.Args, "pc") {
		t.Fatalf("Machine() = %s, want the -machine pc child of %d", m, sb.Pid())
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(sb.QEMUChildren()) != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("QEMUChildren = %v, want both", sb.QEMUChildren())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// While nether runs, its children carry its TMPDIR: they are what
	// would survive it.
	if n := len(sb.Survivors()); n < 2 {
		t.Fatalf("Survivors while running = %v, want at least the two children", sb.Survivors())
	}
	// A nether killed outright leaves its children (nothing here kills
	// them with it): Survivors must name them.
	sb.Signal(syscall.SIGKILL)
	if err := sb.Wait(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	surv := sb.Survivors()
	if !slices.ContainsFunc(surv, func(p Proc) bool { return p.Pid == m.Pid }) {
		t.Fatalf("Survivors after the kill = %v, want it to include %s", surv, m)
	}
	for _, p := range surv {
		p.Signal(syscall.SIGKILL)
	}
	if left := sb.WaitNoSurvivors(5 * time.Second); len(left) > 0 {
		t.Fatalf("still running after SIGKILL: %v", left)
	}
	if m.Alive() {
		t.Fatalf("%s still alive", m)
	}
}

func TestStartRefusesADirtyTmpDir(t *testing.T) {
	tmp := t.TempDir()
	os.WriteFile(filepath.Join(tmp, "x"), nil, 0o600)
	if sb, err := Start(Options{Bin: "/bin/true", TmpDir: tmp, Dir: t.TempDir()}); err == nil {
		sb.Close()
		t.Fatal("Start accepted a TMPDIR that is not empty")
	}
}

func TestListening(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc/net/unix")
	}
	p := filepath.Join(t.TempDir(), "s.sock")
	cases := []struct {
		name string
		make func() func()
		want bool
	}{
		{"no socket", func() func() { return func() {} }, false},
		{"listening", func() func() {
			l, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			return func() { l.Close() }
		}, true},
		{"stale file of a closed listener", func() func() {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
			return func() { os.Remove(p) }
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			undo := tc.make()
			defer undo()
			got, err := Listening(p)
			if err != nil || got != tc.want {
				t.Fatalf("Listening = %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

func TestRaceReports(t *testing.T) {
	report := "==================\nWARNING: DATA RACE\nWrite at 0x00c by goroutine 7:\n  main.f()\n==================\n"
	cases := []struct {
		name, in, want string
	}{
		{"none", "level=INFO msg=hello\n", ""},
		{"one", "level=INFO msg=hello\n" + report + "level=INFO msg=after\n", report + "level=INFO msg=after\n"},
		{"unfenced", "x\nWARNING: DATA RACE\ny\n", "WARNING: DATA RACE\ny\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := RaceReports(tc.in); got != tc.want {
				t.Fatalf("RaceReports = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDirWatchSeesWhatCameAndWent(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs inotify")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "nether-old"), nil, 0o600)
	w, err := WatchDir(dir, "nether-")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	began := time.Now()
	os.WriteFile(filepath.Join(dir, "other"), nil, 0o600)
	os.WriteFile(filepath.Join(dir, "nether-brief"), nil, 0o600)
	os.Remove(filepath.Join(dir, "nether-brief"))
	os.Mkdir(filepath.Join(dir, "nether-dir"), 0o700)
	deadline := time.Now().Add(5 * time.Second)
	for {
		names, err := w.Since(began)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		if strings.Join(names, ",") == "nether-brief,nether-dir" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Since = %v, want [nether-brief nether-dir] (not nether-old, which was there before)", names)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if names, _ := w.Since(time.Now().Add(time.Hour)); len(names) != 1 || names[0] != "nether-dir" {
		t.Fatalf("Since(the future) = %v, want only nether-dir (present now, absent at the start)", names)
	}
}

func TestFDs(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("needs /proc")
	}
	before, err := FDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	fd := int(f.Fd())
	during, err := FDs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	after, _ := FDs(os.Getpid())
	if got := during[fd]; got != os.DevNull {
		t.Errorf("fd %d names %q, want %s", fd, got, os.DevNull)
	}
	if len(during) != len(before)+1 || len(after) != len(before) {
		t.Errorf("descriptor counts %d, %d, %d; want n, n+1, n", len(before), len(during), len(after))
	}
	if got := FDKinds(map[int]string{0: "/dev/null", 1: "socket:[12]", 2: "socket:[13]", 3: "anon_inode:[eventpoll]", 4: "pipe:[9]"}); got != "/dev/null:1 anon_inode:[eventpoll]:1 pipe:1 socket:2" {
		t.Errorf("FDKinds = %q", got)
	}
}
