// Package e2e drives real nether processes booting real guests under
// QEMU. The binaries are built fresh from this tree in TestMain; the guest
// image comes from scripts/setup.sh (build/guest).
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

var (
	repoRoot  string
	binDir    string
	guestDir  string
	skipWhy   string // non-empty: the e2e suite cannot run here
	netherBin string
	ctlBin    string
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
			"!! e2e: SKIPPING every end-to-end test: %s.\n"+
			"!! Run scripts/setup.sh (or the README's test command) to run them.\n"+
			strings.Repeat("!", 72)+"\n\n", skipWhy)
		return m.Run()
	}
	tmp, err := os.MkdirTemp("", "nether-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binDir = tmp
	build := exec.Command("go", "build", "-o", binDir+"/", "./cmd/nether", "./cmd/nether-ctl")
	build.Dir = repoRoot
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building nether: %v\n", err)
		return 1
	}
	netherBin = filepath.Join(binDir, "nether")
	ctlBin = filepath.Join(binDir, "nether-ctl")
	return m.Run()
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
	dir    string
	sock   string
	cmd    *exec.Cmd
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start launches nether in a fresh launch directory with the given extra
// nether.conf lines. The control socket is ctl.sock in that directory.
func start(t *testing.T, extraConf ...string) *sandbox {
	t.Helper()
	needGuest(t)
	return startIn(t, t.TempDir(), extraConf...)
}

// startIn is start in a launch directory the test prepared.
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
	// The socket serves before the guest boots. (Not a stat of the path:
	// a test may have planted a stale socket file there.)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if strings.Contains(sb.stderr.String(), "control socket ready") {
			break
		}
		select {
		case <-sb.done:
			t.Fatalf("nether exited before serving its socket: %v\nstderr:\n%s", sb.err, sb.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("control socket did not appear; stderr:\n%s", sb.stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return sb
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
	select {
	case <-sb.done:
	case <-time.After(timeout):
		sb.t.Fatalf("nether did not exit within %s; stderr:\n%s", timeout, sb.stderr.String())
	}
	return sb.finalLine()
}

var finalRE = regexp.MustCompile(`^\[nether\] (final usage|x402 settlement) \(reason=([a-z]+)\): uptime_ms=\d+ cpu_ms=\d+ mem_peak_mb=\d+ ram_mb=\d+ cpus=\d+ commands=\d+ bytes_in=\d+ bytes_out=\d+ net_tx=\d+ net_rx=\d+ net_blocked=\d+$`)

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

var (
	pidRE = regexp.MustCompile(`guest booting.* pid=(\d+) run_dir=(\S+) mem_dir=(\S+)`)
)

// checkNoLeftovers fails the test if nether left its QEMU process, its
// socket or a temporary file or directory behind.
func (sb *sandbox) checkNoLeftovers() {
	sb.t.Helper()
	if _, err := os.Stat(sb.sock); err == nil {
		sb.t.Errorf("control socket %s left behind", sb.sock)
	}
	m := pidRE.FindStringSubmatch(sb.stderr.String())
	if m == nil {
		sb.t.Errorf("nether did not log its QEMU pid and run directories")
		return
	}
	if b, err := os.ReadFile("/proc/" + m[1] + "/cmdline"); err == nil && bytes.Contains(b, []byte("qemu")) {
		sb.t.Errorf("QEMU process %s left behind", m[1])
	}
	for _, d := range m[2:] {
		if _, err := os.Stat(d); err == nil {
			sb.t.Errorf("temporary directory %s left behind", d)
		}
	}
	entries, _ := os.ReadDir(sb.dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			sb.t.Errorf("temporary file %s left in the launch directory", e.Name())
		}
	}
}

// spawn starts nether in dir without waiting for anything.
func spawn(t *testing.T, dir string, conf ...string) *sandbox {
	t.Helper()
	sb := &sandbox{t: t, dir: dir, sock: filepath.Join(dir, "ctl.sock"),
		stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	text := "control_socket = " + sb.sock + "\n" + strings.Join(conf, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "nether.conf"), []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	sb.cmd = exec.Command(netherBin)
	sb.cmd.Dir = dir
	sb.cmd.Env = append(os.Environ(), "NETHER_GUEST_DIR="+guestDir)
	sb.cmd.Stdout, sb.cmd.Stderr = sb.stdout, sb.stderr
	if err := sb.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { sb.err = sb.cmd.Wait(); close(sb.done) }()
	t.Cleanup(func() {
		select {
		case <-sb.done:
		default:
			sb.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-sb.done:
			case <-time.After(20 * time.Second):
				sb.cmd.Process.Kill()
				<-sb.done
			}
		}
		if t.Failed() {
			t.Logf("nether (%s) stderr:\n%s", dir, sb.stderr.String())
		}
	})
	return sb
}
