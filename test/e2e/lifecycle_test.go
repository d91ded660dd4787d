package e2e

import (
	"bufio"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/testharness"
)

func TestShutdownWithX402(t *testing.T) {
	t.Parallel()
	sb := start(t, "x402 = on")
	c := sb.dial()
	if body, exit := run(t, c, "echo up"); body != "up\n" || exit != 0 {
		t.Fatalf("%q %d", body, exit)
	}
	if body, exit := run(t, c, "__shutdown__"); body != "OK shutting down\n" || exit != 0 {
		t.Fatalf("shutdown reply %q %d", body, exit)
	}
	line := sb.wait(30 * time.Second)
	if !strings.HasPrefix(line, "[nether] x402 settlement (reason=shutdown): ") || !strings.Contains(line, " commands=1 ") {
		t.Fatalf("final record %q", line)
	}
	if sb.cmd.ProcessState.ExitCode() != 0 {
		t.Fatalf("exit status %d", sb.cmd.ProcessState.ExitCode())
	}
	sb.checkNoLeftovers()
}

func TestGuestPowerOff(t *testing.T) {
	t.Parallel()
	sb := start(t)
	c := sb.dial()
	run(t, c, "true")
	c.Close()
	// A raw connection that is the primary: a client that connects after
	// the primary hung up takes its slot (one that connected before it
	// stays an observer), so ask until this one may drive.
	var raw *rawConn
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw = rawDial(t, sb.sock)
		raw.send(t, "true")
		body, exit, err := raw.reply(30 * time.Second)
		if err == nil && exit == 0 {
			break
		}
		raw.Close()
		if err != nil || !strings.Contains(body, "read-only observer") || time.Now().After(deadline) {
			t.Fatalf("could not become primary: %q exit %d err %v", body, exit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The guest powers itself off; no reply is expected.
	raw.send(t, "poweroff -f")
	line := sb.wait(30 * time.Second)
	if !strings.HasPrefix(line, "[nether] final usage (reason=poweroff): ") {
		t.Fatalf("final record %q", line)
	}
	if code := sb.h.ExitCode(); code != 0 {
		t.Errorf("exit status %d after a guest power-off, want 0", code)
	}
	sb.checkNoLeftovers()
}

func TestSIGTERMDuringLongCommand(t *testing.T) {
	sb := start(t)
	c := sb.dial()
	run(t, c, "true") // the agent is up
	c.Close()
	raw, err := net.Dial("unix", sb.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.Write([]byte("echo started; sleep 60\n"))
	r := bufio.NewReader(raw)
	raw.SetReadDeadline(time.Now().Add(30 * time.Second))
	if l, err := r.ReadString('\n'); err != nil || l != "started\n" {
		t.Fatalf("command did not start: %q %v", l, err)
	}
	began := time.Now()
	sb.cmd.Process.Signal(syscall.SIGTERM)
	line := sb.wait(20 * time.Second)
	if !strings.HasPrefix(line, "[nether] final usage (reason=sigterm): ") {
		t.Fatalf("final record %q", line)
	}
	t.Logf("SIGTERM to exit: %s", time.Since(began))
	// The client sees its connection end rather than hang.
	if _, err := io.Copy(io.Discard, r); err != nil {
		t.Fatalf("client connection: %v", err)
	}
	sb.checkNoLeftovers()
}

func TestConsoleMode(t *testing.T) {
	t.Parallel()
	needGuest(t)
	// Input before the shell opened the console would be dropped by the
	// guest's tty, so the input goes in once the prompt is out.
	prompt := &promptWriter{prompt: "sandbox# "}
	sb := launch(t, testharness.Options{Dir: t.TempDir(), Conf: []string{"# console mode: no control_socket"},
		StdinPipe: true, Stdout: prompt})
	prompt.onPrompt = func() { sb.h.Stdin.Write([]byte("echo hello-$((6*7))\nexit\n")) }
	if err := sb.h.Wait(60 * time.Second); err != nil {
		t.Fatalf("console mode did not finish: %v; stdout so far:\n%s\nstderr:\n%s", err, sb.stdout.String(), sb.stderr.String())
	}
	sb.checkRace()
	got := sb.stdout.String()
	if !strings.Contains(got, "hello-42") {
		t.Fatalf("console output lacks the command's output:\n%s", got)
	}
	if !strings.Contains(got, "[nether] final usage (reason=poweroff): ") {
		t.Fatalf("no final record:\n%s", got)
	}
	if b, err := os.ReadFile(filepath.Join(sb.dir, "console.log")); err != nil || !strings.Contains(string(b), "hello-42") {
		t.Fatalf("console.log lacks the session: %v", err)
	}
	sb.checkLeftoversAfterKill() // no socket in console mode; nothing else may remain
}

// promptWriter calls onPrompt once, the first time what was written so
// far ends with prompt.
type promptWriter struct {
	mu       sync.Mutex
	prompt   string
	seen     strings.Builder
	fired    bool
	onPrompt func()
}

func (w *promptWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.fired {
		w.seen.Write(p)
		if strings.Contains(w.seen.String(), w.prompt) && w.onPrompt != nil {
			w.fired = true
			go w.onPrompt()
		}
	}
	return len(p), nil
}

// TestConfigErrorsStopBeforeBoot needs no QEMU and no guest: nether
// refuses its configuration before it starts anything.
func TestConfigErrorsStopBeforeBoot(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, conf, want string
	}{
		{"malformed value", "control_socket = x.sock\nram_mb = lots", "nether.conf:2: ram_mb"},
		{"unknown key", "cpus = 1\nbogus = 1", "nether.conf:2: bogus"},
		{"missing kernel", "kernel = /nonexistent/vmlinux", "nether.conf:1: kernel"},
		{"bad sandbox_id", "sandbox_id = has space", "nether.conf:1: sandbox_id"},
		{"bad hostname", "hostname = not_a_label!", "nether.conf:1: hostname"},
		{"no conf at all", "", "nether.conf"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := testharness.Options{Dir: t.TempDir(), NoConf: c.conf == ""}
			if c.conf != "" {
				o.Conf = strings.Split(c.conf, "\n")
			}
			sb := runToEnd(t, o, 30*time.Second)
			out := sb.stdout.String() + sb.stderr.String()
			if code := sb.h.ExitCode(); code != 2 {
				t.Fatalf("want exit 2, got %d\n%s", code, out)
			}
			if !strings.Contains(out, c.want) {
				t.Fatalf("message %q lacks %q", out, c.want)
			}
			entries, _ := os.ReadDir(sb.dir)
			for _, e := range entries {
				if e.Name() != "nether.conf" {
					t.Errorf("nether created %s before refusing its config", e.Name())
				}
			}
			if left, _ := testharness.Entries(sb.h.TmpDir); len(left) > 0 {
				t.Errorf("nether created %v in its TMPDIR before refusing its config", left)
			}
			if len(sb.h.QEMUChildren()) > 0 || len(sb.h.Survivors()) > 0 {
				t.Errorf("nether started a process before refusing its config: %v", sb.h.Survivors())
			}
		})
	}
}

// runToEnd launches nether as o describes and waits up to timeout for it
// to exit by itself.
func runToEnd(t *testing.T, o testharness.Options, timeout time.Duration) *sandbox {
	t.Helper()
	sb := launch(t, o)
	if err := sb.h.Wait(timeout); err != nil {
		t.Fatalf("nether in %s: %v; stderr:\n%s", sb.dir, err, sb.stderr.String())
	}
	sb.checkRace()
	return sb
}

func TestControlSocketOwnership(t *testing.T) {
	t.Parallel()
	a := start(t)
	t.Run("a live socket is refused", func(t *testing.T) {
		second := runToEnd(t, testharness.Options{Dir: t.TempDir(), Socket: a.sock}, time.Minute)
		if code, out := second.h.ExitCode(), second.stderr.String(); code == 0 || !strings.Contains(out, "served by a running process") {
			t.Fatalf("second nether on a live socket: exit %d\n%s", code, out)
		}
		if _, err := os.Stat(a.sock); err != nil {
			t.Fatal("the live socket was removed")
		}
		c := a.dial()
		if _, err := c.Query(t.Context(), "__info__"); err != nil {
			t.Fatalf("first nether harmed: %v", err)
		}
	})
	t.Run("a stale socket is replaced", func(t *testing.T) {
		dir := t.TempDir()
		stale := filepath.Join(dir, "ctl.sock")
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		l.SetUnlinkOnClose(false)
		l.Close()
		if _, err := os.Stat(stale); err != nil {
			t.Fatal("could not make a stale socket")
		}
		b := startIn(t, dir)
		c := b.dial()
		if body, exit := run(t, c, "echo fresh"); body != "fresh\n" || exit != 0 {
			t.Fatalf("%q %d", body, exit)
		}
		if !strings.Contains(b.stderr.String(), "stale") {
			t.Errorf("replacing a stale socket was not logged")
		}
	})
}

// TestPeerUIDCheck: the socket is 0600, and even when someone loosens the
// file mode, a client of another uid is refused by the peer-credential
// check with a framed ERR.
func TestPeerUIDCheck(t *testing.T) {
	t.Parallel()
	if os.Getuid() != 0 {
		t.Skip("SKIPPED: needs root to connect as another uid")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("SKIPPED: setpriv (util-linux) not installed")
	}
	dir, err := os.MkdirTemp("", "nether-uid-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	sb := startIn(t, dir)
	fi, err := os.Stat(sb.sock)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v (err %v), want 0600", fi.Mode().Perm(), err)
	}
	os.Chmod(sb.sock, 0o666) // an operator mistake; the peer check still holds
	out, _ := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups",
		ctlBin, "-timeout", "20s", sb.sock, "echo", "intruder").CombinedOutput()
	t.Logf("nether-ctl as uid 65534: %s", out)
	if !strings.Contains(string(out), "ERR permission denied") {
		t.Fatalf("a client of another uid was not refused: %s", out)
	}
	// The owner still drives.
	c := sb.dial()
	if body, exit := run(t, c, "echo owner"); body != "owner\n" || exit != 0 {
		t.Fatalf("%q %d", body, exit)
	}
}
