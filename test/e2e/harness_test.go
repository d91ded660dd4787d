// Package e2e drives real nether processes booting real guests under
// QEMU. The binaries are built fresh from this tree in TestMain (nether
// with the race detector); the guest image comes from scripts/setup.sh
// (build/guest). The process harness is internal/testharness, shared with
// the benchmarks; this file adapts it to package testing.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"debug/buildinfo"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

var (
	repoRoot  string
	binDir    string
	guestDir  string
	skipWhy   string // non-empty: the guest cannot run here
	netherBin string // built with -race
	ctlBin    string
	nexusBin  string                // built with -race
	shmWatch  *testharness.DirWatch // nether-* entries appearing in /dev/shm
)

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	wd, _ := os.Getwd()
	repoRoot = filepath.Clean(filepath.Join(wd, "..", ".."))
	guestDir = filepath.Join(repoRoot, "build", "guest")
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		skipWhy = "qemu-system-x86_64 is not installed"
	} else if _, err := os.Stat(filepath.Join(guestDir, "initramfs.cpio")); err != nil {
		skipWhy = "the guest image is not built (build/guest/initramfs.cpio missing)"
	}
	if skipWhy != "" {
		if os.Getenv("CI") != "" {
			fmt.Fprintf(os.Stderr, "e2e: FATAL: %s, and CI is set: the end-to-end tests must run in CI. Run scripts/setup.sh first.\n", skipWhy)
			return 1
		}
		fmt.Fprintf(os.Stderr, "\n"+strings.Repeat("!", 72)+"\n"+
			"!! e2e: SKIPPING every end-to-end test that needs a guest: %s.\n"+
			"!! Run scripts/setup.sh (or the README's test command) to run them.\n"+
			strings.Repeat("!", 72)+"\n\n", skipWhy)
	}
	// The binaries are built even without a guest: some tests need no
	// QEMU (a configuration error stops nether before any boot).
	tmp, err := os.MkdirTemp("", "nether-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binDir = tmp
	if err := testharness.Build(repoRoot, binDir, []string{"-race"}, "./cmd/nether"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building nether with -race: %v\n", err)
		return 1
	}
	if err := testharness.Build(repoRoot, binDir, nil, "./cmd/nether-ctl"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building nether-ctl: %v\n", err)
		return 1
	}
	if err := testharness.Build(repoRoot, binDir, []string{"-race"}, "./cmd/nexus"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building nexus: %v\n", err)
		return 1
	}
	netherBin = filepath.Join(binDir, "nether")
	ctlBin = filepath.Join(binDir, "nether-ctl")
	nexusBin = filepath.Join(binDir, "nexus")
	if bi, err := buildinfo.ReadFile(netherBin); err != nil || !slices.Contains(bi.Settings, debug.BuildSetting{Key: "-race", Value: "true"}) {
		fmt.Fprintf(os.Stderr, "e2e: %s is not built with the race detector (%v)\n", netherBin, err)
		return 1
	}
	raceNoExitSleep()
	// Guest memory is a memfd: nothing named nether-* may ever appear in
	// /dev/shm, not even for a moment.
	if shmWatch, err = testharness.WatchDir("/dev/shm", "nether-"); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: watching /dev/shm: %v\n", err)
		return 1
	}
	defer shmWatch.Close()
	return m.Run()
}

// Tests that only wait on guests run side by side (t.Parallel: after the
// serial ones, two at a time on two cores, -parallel's default of
// GOMAXPROCS). Every check a test makes of what nether leaves is scoped
// to its own nether (its private TMPDIR, the processes carrying it, its
// launch directory) or its own nexus state directory, so a neighbour's
// processes and files are never taken for leftovers. The one check that
// is not, /dev/shm, forbids nether-* entries outright: one made by any
// nether fails whichever test sees it. Tests that measure time (pause
// lengths, clock offsets, timers, budgets, rates, "answered within"
// bounds of a few seconds) or kill a process at a chosen moment stay
// serial, so a busy neighbour never moves what they measure.

// raceNoExitSleep sets atexit_sleep_ms=0 in GORACE for every process the
// suite starts (they inherit its environment), unless the caller chose a
// value. A race-built program sleeps that long (1000 ms by default) as it
// exits, with its main goroutine already done, only so that goroutines
// still running can race some more; a report in progress is waited for
// either way. Every nexus command and every nether exit paid that second:
// well over a hundred seconds a run, nexus's tests most (each nexus
// command is a process). The detector sees everything the programs do
// while they run, as before.
func raceNoExitSleep() {
	g := os.Getenv("GORACE")
	if strings.Contains(g, "atexit_sleep_ms") {
		return
	}
	os.Setenv("GORACE", strings.TrimSpace(g+" atexit_sleep_ms=0"))
}

func needGuest(t *testing.T) {
	t.Helper()
	if skipWhy != "" {
		t.Skipf("SKIPPED (no guest): %s", skipWhy)
	}
}

// sandbox is one nether process under test.
type sandbox struct {
	t      *testing.T
	h      *testharness.Sandbox
	dir    string
	sock   string
	cmd    *exec.Cmd
	stdout *testharness.Buffer
	stderr *testharness.Buffer
	done   <-chan struct{}

	raceReported bool
}

// launch starts nether as o describes, with a private empty TMPDIR, and
// registers the checks every nether gets when its test ends: it is
// stopped if it still runs; a data race it reported fails the test with
// the report; its TMPDIR must be empty, no process of its may survive it,
// and nothing named nether-* may have appeared in /dev/shm.
func launch(t *testing.T, o testharness.Options) *sandbox {
	t.Helper()
	o.Bin = netherBin
	if o.GuestDir == "" {
		o.GuestDir = guestDir
	}
	if o.TmpDir == "" {
		// Short, not t.TempDir(): nether makes Unix sockets in it, and a
		// socket path has a 108-byte limit.
		tmp, err := os.MkdirTemp("", "e2e-tmp-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(tmp) })
		o.TmpDir = tmp
	}
	h, err := testharness.Start(o)
	if err != nil {
		t.Fatal(err)
	}
	sb := &sandbox{t: t, h: h, dir: h.Dir, sock: h.Sock, cmd: h.Cmd, stdout: h.Stdout, stderr: h.Stderr, done: h.Done()}
	t.Cleanup(func() {
		if !h.Stop(20 * time.Second) {
			t.Errorf("nether (%s) did not end within 20 s of SIGTERM at the end of the test; killed", h.Dir)
		}
		sb.checkRace()
		if left, _ := testharness.Entries(h.TmpDir); len(left) > 0 {
			t.Errorf("nether (%s) left %v in its private TMPDIR %s", h.Dir, left, h.TmpDir)
		}
		if procs := h.WaitNoSurvivors(5 * time.Second); len(procs) > 0 {
			for _, p := range procs {
				t.Errorf("a process of nether (%s) outlived it: %s", h.Dir, p)
				p.Signal(syscall.SIGCONT)
				p.Signal(syscall.SIGKILL)
			}
		}
		sb.checkShm()
		if t.Failed() {
			t.Logf("nether (%s) exit %v, stderr:\n%s", h.Dir, h.Err(), tail(h.Stderr.String(), 20000))
		}
	})
	return sb
}

// checkRace fails the test loudly if nether reported a data race (once
// per nether).
func (sb *sandbox) checkRace() {
	sb.t.Helper()
	if r := testharness.RaceReports(sb.stderr.String()); r != "" && !sb.raceReported {
		sb.raceReported = true
		sb.t.Errorf("\n%s\n!! DATA RACE in nether (%s):\n%s\n%s", strings.Repeat("!", 72), sb.dir, r, strings.Repeat("!", 72))
	}
}

// checkShm fails the test if a nether-* entry appeared in /dev/shm since
// this nether started.
func (sb *sandbox) checkShm() {
	sb.t.Helper()
	names, err := shmWatch.Since(sb.h.Started)
	if err != nil {
		sb.t.Errorf("watching /dev/shm: %v", err)
	}
	if len(names) > 0 {
		sb.t.Errorf("%v appeared in /dev/shm while nether (%s) ran (it, or a nether of a test running beside it, made it); guest memory must be a memfd", names, sb.dir)
	}
}

// spawn starts nether in dir with control_socket = dir/ctl.sock and the
// given extra nether.conf lines, without waiting for anything.
func spawn(t *testing.T, dir string, conf ...string) *sandbox {
	t.Helper()
	return launch(t, testharness.Options{Dir: dir, Socket: filepath.Join(dir, "ctl.sock"), Conf: conf})
}

// start launches nether in a fresh launch directory with the given extra
// nether.conf lines. The control socket is ctl.sock in that directory.
func start(t *testing.T, extraConf ...string) *sandbox {
	t.Helper()
	needGuest(t)
	return startIn(t, t.TempDir(), extraConf...)
}

// startIn is start in a launch directory the test prepared. It returns
// once the control socket listens (the socket serves before the guest
// boots).
func startIn(t *testing.T, dir string, extraConf ...string) *sandbox {
	t.Helper()
	needGuest(t)
	sb := spawn(t, dir, extraConf...)
	t.Cleanup(func() {
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(dir, "console.log")); err == nil {
				t.Logf("console.log (tail):\n%s", tail(string(b), 3000))
			}
		}
	})
	sb.waitListening(10 * time.Second)
	return sb
}

// waitListening waits for the control socket to listen.
func (sb *sandbox) waitListening(timeout time.Duration) {
	sb.t.Helper()
	if err := sb.h.WaitListening(timeout); err != nil {
		sb.t.Fatalf("%v\nstderr:\n%s", err, sb.stderr.String())
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// dial connects a client (primary if it is the first).
func (sb *sandbox) dial() *client.Client {
	sb.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, sb.sock)
	if err != nil {
		sb.t.Fatalf("dial: %v", err)
	}
	sb.t.Cleanup(func() { c.Close() })
	return c
}

// info is one __info__ report as key=value pairs.
func (sb *sandbox) info(c *client.Client) map[string]string {
	sb.t.Helper()
	body, err := c.Query(context.Background(), "__info__")
	if err != nil {
		sb.t.Fatalf("__info__: %v", err)
	}
	return parseReport(body)
}

func parseReport(body string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(body, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// qemu returns the QEMU child that runs this sandbox's guest.
func (sb *sandbox) qemu() testharness.Proc {
	sb.t.Helper()
	p, ok := sb.h.Machine()
	if !ok {
		sb.t.Fatalf("nether %d has no QEMU child running a guest (children: %v)", sb.h.Pid(), sb.h.QEMUChildren())
	}
	return p
}

// freeze stops p with SIGSTOP; the test's cleanup continues it (if it
// still exists) before nether is stopped, so a failing test never leaves
// a frozen QEMU behind.
func freeze(t *testing.T, p testharness.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP %s: %v", p, err)
	}
	t.Cleanup(func() { p.Signal(syscall.SIGCONT) })
	deadline := time.Now().Add(2 * time.Second)
	for {
		now, err := testharness.ReadProc(p.Pid)
		if err != nil || now.State == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU %d did not stop (state %c)", p.Pid, now.State)
		}
		time.Sleep(time.Millisecond)
	}
}

// run runs a command and returns its body and exit.
func run(t *testing.T, c *client.Client, line string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var out bytes.Buffer
	exit, err := c.Run(ctx, line, &out)
	var ce *client.ControlError
	if errors.As(err, &ce) {
		return ce.Msg, exit
	}
	if err != nil {
		t.Fatalf("%q: %v", line, err)
	}
	return out.String(), exit
}

// rawRun sends one line on a fresh raw connection and returns the raw
// reply up to and including its trailer.
func rawRun(t *testing.T, sock, line string) string {
	t.Helper()
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	body, err := r.ReadString(0x1e)
	if err != nil {
		t.Fatalf("%q: reading reply: %v (got %q)", line, err, body)
	}
	trailer, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("%q: reading trailer: %v", line, err)
	}
	return body + trailer
}

// wait waits for nether to exit and returns its final usage line.
func (sb *sandbox) wait(timeout time.Duration) string {
	sb.t.Helper()
	if err := sb.h.Wait(timeout); err != nil {
		sb.t.Fatalf("%v; stderr:\n%s", err, sb.stderr.String())
	}
	sb.checkRace()
	return sb.finalLine()
}

var finalRE = regexp.MustCompile(`^\[nether\] (final usage|x402 settlement) \(reason=([a-z_]+)\): uptime_ms=\d+ cpu_ms=\d+ mem_peak_mb=\d+ ram_mb=\d+ cpus=\d+ commands=\d+ bytes_in=\d+ bytes_out=\d+ net_tx=\d+ net_rx=\d+ net_blocked=\d+ data_conns=\d+ data_ms=\d+$`)

// finalLine checks there is exactly one final record and returns it.
func (sb *sandbox) finalLine() string {
	sb.t.Helper()
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(sb.stdout.String()))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "[nether] ") {
			lines = append(lines, sc.Text())
		}
	}
	if len(lines) != 1 {
		sb.t.Fatalf("want exactly one final record on stdout, got %d:\n%s", len(lines), sb.stdout.String())
	}
	if !finalRE.MatchString(lines[0]) {
		sb.t.Fatalf("final record malformed: %q", lines[0])
	}
	return lines[0]
}

// checkNoLeftovers fails the test if nether, which must have exited, left
// anything behind: its control socket, a QEMU (or any other process of
// its), a temporary file in the launch directory, anything in its private
// TMPDIR, or a nether-* entry in /dev/shm.
func (sb *sandbox) checkNoLeftovers() {
	sb.t.Helper()
	if !sb.h.Exited() {
		sb.t.Errorf("checkNoLeftovers: nether (%s) still runs", sb.dir)
		return
	}
	if _, err := os.Lstat(sb.sock); err == nil {
		sb.t.Errorf("control socket %s left behind", sb.sock)
	}
	sb.checkLeftoversAfterKill()
}

// checkLeftoversAfterKill is checkNoLeftovers for a nether that could not
// clean up (SIGKILL): its socket file may remain, nothing else.
func (sb *sandbox) checkLeftoversAfterKill() {
	sb.t.Helper()
	for _, p := range sb.h.WaitNoSurvivors(5 * time.Second) {
		sb.t.Errorf("a process of nether survived it: %s", p)
	}
	if left, err := testharness.Entries(sb.h.TmpDir); err != nil || len(left) > 0 {
		sb.t.Errorf("nether's private TMPDIR %s holds %v (err %v), want nothing", sb.h.TmpDir, left, err)
	}
	entries, _ := os.ReadDir(sb.dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			sb.t.Errorf("temporary file %s left in the launch directory", e.Name())
		}
	}
	sb.checkShm()
}
