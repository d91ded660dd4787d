package e2e

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestShutdownWithX402(t *testing.T) {
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
	sb := start(t)
	c := sb.dial()
	run(t, c, "true")
	raw, err := net.Dial("unix", sb.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c.Close()
	// The guest powers itself off; no reply is expected.
	time.Sleep(200 * time.Millisecond)
	raw.Write([]byte("poweroff -f\n"))
	line := sb.wait(30 * time.Second)
	if !strings.HasPrefix(line, "[nether] final usage (reason=poweroff): ") {
		t.Fatalf("final record %q", line)
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
	needGuest(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("# console mode: no control_socket\n"), 0o600)
	cmd := exec.Command(netherBin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "NETHER_GUEST_DIR="+guestDir)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	out := make(chan string, 1)
	var all strings.Builder
	go func() {
		r := bufio.NewReader(stdout)
		sent := false
		for {
			b, err := r.ReadByte()
			if err != nil {
				out <- all.String()
				return
			}
			all.WriteByte(b)
			// Input before the shell opened the console would be dropped
			// by the guest's tty, so wait for the prompt.
			if !sent && strings.HasSuffix(all.String(), "sandbox# ") {
				sent = true
				stdin.Write([]byte("echo hello-$((6*7))\nexit\n"))
			}
		}
	}()
	var got string
	select {
	case got = <-out:
	case <-time.After(60 * time.Second):
		t.Fatalf("console mode did not finish; stdout so far:\n%s\nstderr:\n%s", all.String(), stderr.String())
	}
	cmd.Wait()
	if !strings.Contains(got, "hello-42") {
		t.Fatalf("console output lacks the command's output:\n%s", got)
	}
	if !strings.Contains(got, "[nether] final usage (reason=poweroff): ") {
		t.Fatalf("no final record:\n%s", got)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "console.log")); err != nil || !strings.Contains(string(b), "hello-42") {
		t.Fatalf("console.log lacks the session: %v", err)
	}
}

func TestConfigErrorsStopBeforeBoot(t *testing.T) {
	if netherBin == "" {
		t.Skip("SKIPPED: nether was not built (no guest image)")
	}
	cases := []struct {
		name, conf, want string
	}{
		{"malformed value", "control_socket = x.sock\nram_mb = lots\n", "nether.conf:2: ram_mb"},
		{"unknown key", "cpus = 1\nbogus = 1\n", "nether.conf:2: bogus"},
		{"missing kernel", "kernel = /nonexistent/vmlinux\n", "nether.conf:1: kernel"},
		{"no conf at all", "", "nether.conf"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			if c.conf != "" {
				os.WriteFile(filepath.Join(dir, "nether.conf"), []byte(c.conf), 0o600)
			}
			cmd := exec.Command(netherBin)
			cmd.Dir = dir
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("want exit 2, got %v\n%s", err, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("message %q lacks %q", out, c.want)
			}
			entries, _ := os.ReadDir(dir)
			for _, e := range entries {
				if e.Name() != "nether.conf" {
					t.Errorf("nether created %s before refusing its config", e.Name())
				}
			}
		})
	}
}

func TestControlSocketOwnership(t *testing.T) {
	a := start(t)
	t.Run("a live socket is refused", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "nether.conf"), []byte("control_socket = "+a.sock+"\n"), 0o600)
		cmd := exec.Command(netherBin)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "NETHER_GUEST_DIR="+guestDir)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "served by a running process") {
			t.Fatalf("second nether on a live socket: %v\n%s", err, out)
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
