package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestDrive boots one sandbox and runs the protocol's rules against it in
// order. Subtests share the guest because a cold boot under TCG costs
// seconds.
func TestDrive(t *testing.T) {
	sb := start(t)
	c := sb.dial()

	t.Run("early command waits for the agent", func(t *testing.T) {
		// Sent right after the socket appeared: the guest is still booting.
		body, exit := run(t, c, "echo ready")
		if body != "ready\n" || exit != 0 {
			t.Fatalf("got %q exit %d", body, exit)
		}
	})

	t.Run("exit codes", func(t *testing.T) {
		for _, tc := range []struct {
			cmd  string
			exit int
		}{
			{"true", 0}, {"false", 1}, {"exit 7", 7}, {"exit 255", 255},
			{"kill -9 $$", 137}, // a signalled shell: 128+SIGKILL
			{"kill -TERM $$", 143},
		} {
			t.Run(tc.cmd, func(t *testing.T) {
				if _, exit := run(t, c, tc.cmd); exit != tc.exit {
					t.Fatalf("exit %d, want %d", exit, tc.exit)
				}
			})
		}
	})

	t.Run("the agent as init: mounts, lo up, hostname, orphans reaped", func(t *testing.T) {
		body, exit := run(t, c, "hostname; cat /sys/class/net/lo/flags; grep -c -E ' (/proc|/sys|/dev|/dev/pts|/run) ' /proc/mounts")
		if exit != 0 || body != "sandbox\n0x9\n5\n" {
			t.Fatalf("got %q exit %d; want hostname sandbox, lo flags 0x9 (UP|LOOPBACK), 5 mounts", body, exit)
		}
		// A double fork leaves an orphan for PID 1 to reap.
		run(t, c, "(sleep 0.2 &) ; true")
		time.Sleep(time.Second)
		body, _ = run(t, c, "ps -o stat,comm | awk '$1 ~ /^Z/' | wc -l")
		if strings.TrimSpace(body) != "0" {
			t.Fatalf("zombies left: %q", body)
		}
	})

	t.Run("stdout and stderr interleave in one body", func(t *testing.T) {
		body, exit := run(t, c, "echo out; echo err >&2; echo out2")
		if body != "out\nerr\nout2\n" || exit != 0 {
			t.Fatalf("got %q exit %d", body, exit)
		}
	})

	t.Run("output streams while the command runs", func(t *testing.T) {
		w := &firstByteWriter{}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		start := time.Now()
		exit, err := c.Run(ctx, "echo first; sleep 2; echo second", w)
		total := time.Since(start)
		if err != nil || exit != 0 {
			t.Fatalf("exit %d err %v", exit, err)
		}
		if first := w.first.Sub(start); first > total-time.Second {
			t.Fatalf("first byte after %s of %s: output was not streamed", first, total)
		}
	})

	t.Run("output over the cap is truncated and the frame stays intact", func(t *testing.T) {
		body, exit := run(t, c, "head -c 2097152 /dev/zero | tr '\\0' a; exit 3")
		want := strings.Repeat("a", 1<<20) + "\n...[output capped]\n"
		if body != want {
			t.Fatalf("body: %d bytes, ends %q", len(body), tail(body, 40))
		}
		if exit != 3 {
			t.Fatalf("exit %d, want 3 (the exit must survive the cap)", exit)
		}
		// The next reply is in sync.
		if body, exit := run(t, c, "echo next"); body != "next\n" || exit != 0 {
			t.Fatalf("after cap: %q %d", body, exit)
		}
	})

	t.Run("delimiter bytes in output survive escaping", func(t *testing.T) {
		body, exit := run(t, c, `printf 'a\036b\037c\0365\n'`)
		if body != "a\x1eb\x1fc\x1e5\n" || exit != 0 {
			t.Fatalf("got %q exit %d", body, exit)
		}
	})

	t.Run("a command carrying a raw delimiter is refused", func(t *testing.T) {
		for _, line := range []string{"echo \x1e0", "echo \x1f"} {
			got := rawRun(t, sb.sock, line)
			if !strings.HasPrefix(got, "ERR ") || !strings.HasSuffix(got, "\x1e-1\n") {
				t.Fatalf("%q: got %q", line, got)
			}
		}
	})

	t.Run("reports", func(t *testing.T) {
		ctx := context.Background()
		info, err := c.Query(ctx, "__info__")
		if err != nil {
			t.Fatal(err)
		}
		// A boot with nothing handed in: a minted sandbox id, the default
		// hostname, no lineage.
		for _, k := range []string{"proto_version=2", "backend=qemu", "accel=tcg", "arch=x86_64", "cpus=1", "ram_mb=512", "max_output_bytes=1048576", "x402=off",
			"hostname=sandbox", "generation=0", "parent=-", "snapshot=-", "agent=connected"} {
			if !hasLine(info, k) {
				t.Errorf("__info__ lacks %s:\n%s", k, info)
			}
		}
		if id := parseReport(info)["sandbox_id"]; id == "" || id == "-" || strings.ContainsAny(id, " \t") {
			t.Errorf("__info__ sandbox_id=%q, want a minted id:\n%s", id, info)
		}
		stats, err := c.Query(ctx, "__stats__")
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"uptime_ms=", "cpu_ms=", "mem_peak_mb=", "ram_mb=512", "cpus=1", "commands=", "bytes_in=", "bytes_out="} {
			if !strings.Contains(stats, k) {
				t.Errorf("__stats__ lacks %s:\n%s", k, stats)
			}
		}
		help, err := c.Query(ctx, "__help__")
		if err != nil || !strings.Contains(help, "proto_version=2") || !strings.Contains(help, "__put__") {
			t.Errorf("__help__: %v\n%s", err, help)
		}
	})

	t.Run("control-plane errors are framed with exit -1", func(t *testing.T) {
		for _, tc := range []struct{ line, want string }{
			{"__bogus__", "unknown command"},
			{"__get__ a b c", "exactly 2"},
			{"__put__ onlyone", "exactly 2"},
			{"__netlog__", "needs net = 1 in nether.conf"},
			{"__events__ -1", "non-negative integer"},
			{"__snapshot__ a b", "argument"},
		} {
			t.Run(tc.line, func(t *testing.T) {
				body, exit := run(t, c, tc.line)
				if exit != -1 || !strings.HasPrefix(body, "ERR ") || !strings.Contains(body, tc.want) {
					t.Fatalf("got %q exit %d, want ERR containing %q", body, exit, tc.want)
				}
			})
		}
	})

	t.Run("put then get 5 MiB round trip", func(t *testing.T) {
		data := make([]byte, 5<<20)
		rand.Read(data)
		if err := os.WriteFile(filepath.Join(sb.dir, "in.bin"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		if body, exit := run(t, c, "__put__ in.bin /tmp/blob"); exit != 0 || !strings.HasPrefix(body, "OK") {
			t.Fatalf("put: %q %d", body, exit)
		}
		sum := sha256.Sum256(data)
		if body, _ := run(t, c, "sha256sum /tmp/blob"); !strings.HasPrefix(body, hexString(sum[:])) {
			t.Fatalf("guest checksum %q, want %x", body, sum)
		}
		if body, exit := run(t, c, "__get__ /tmp/blob out.bin"); exit != 0 || !strings.HasPrefix(body, "OK") {
			t.Fatalf("get: %q %d", body, exit)
		}
		back, err := os.ReadFile(filepath.Join(sb.dir, "out.bin"))
		if err != nil || sha256.Sum256(back) != sum {
			t.Fatalf("host copy differs (%d bytes, err %v)", len(back), err)
		}
	})

	t.Run("transfer jail", func(t *testing.T) {
		outside := t.TempDir()
		os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
		os.Symlink(outside, filepath.Join(sb.dir, "escape"))
		os.Symlink(filepath.Join(outside, "secret"), filepath.Join(sb.dir, "secretlink"))
		os.Mkdir(filepath.Join(sb.dir, "sub"), 0o700)
		for _, line := range []string{
			"__put__ ../secret /tmp/x",
			"__put__ " + filepath.Join(outside, "secret") + " /tmp/x",
			"__put__ escape/secret /tmp/x",
			"__put__ secretlink /tmp/x",
			"__put__ sub/../../secret /tmp/x",
			"__get__ /etc/hostname ../stolen",
			"__get__ /etc/hostname escape/stolen",
			"__get__ /etc/hostname " + filepath.Join(outside, "stolen"),
			"__get__ /etc/hostname secretlink",
		} {
			t.Run(line, func(t *testing.T) {
				body, exit := run(t, c, line)
				if exit != -1 || !strings.HasPrefix(body, "ERR ") {
					t.Fatalf("got %q exit %d, want a refusal", body, exit)
				}
			})
		}
		if _, err := os.Stat(filepath.Join(outside, "stolen")); err == nil {
			t.Fatal("a __get__ wrote outside the jail")
		}
		if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
			t.Fatal("a __get__ overwrote a file outside the jail through a symlink")
		}
		if body, exit := run(t, c, "__get__ /etc/hostname sub/hostname"); exit != 0 {
			t.Fatalf("a get into a jail subdirectory failed: %q", body)
		}
	})

	t.Run("transfer errors name the problem", func(t *testing.T) {
		for _, tc := range []struct{ line, want string }{
			{"__put__ missing.bin /tmp/x", "no such file"},
			{"__get__ /nonexistent out", "no such file"},
			{"__get__ /tmp out", "not a regular file"},
		} {
			body, exit := run(t, c, tc.line)
			if exit != -1 || !strings.Contains(strings.ToLower(body), tc.want) {
				t.Errorf("%s: got %q exit %d, want ERR mentioning %q", tc.line, body, exit, tc.want)
			}
		}
	})

	t.Run("an observer cannot drive", func(t *testing.T) {
		o := sb.dial()
		body, exit := run(t, o, "echo hi")
		if exit != -1 || !strings.Contains(body, "read-only observer") {
			t.Fatalf("observer drove: %q %d", body, exit)
		}
		if body, exit := run(t, o, "__shutdown__"); exit != -1 || !strings.Contains(body, "read-only") {
			t.Fatalf("observer shut down: %q %d", body, exit)
		}
		if _, err := o.Query(context.Background(), "__stats__"); err != nil {
			t.Fatalf("observer query: %v", err)
		}
		o.Close()
	})

	t.Run("nether-ctl", func(t *testing.T) {
		out, err := exec.Command(ctlBin, sb.sock+"x", "true").CombinedOutput()
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) || ee.ExitCode() != 125 {
			t.Fatalf("bad socket: %v %s", err, out)
		}
	})

	// From here on the primary changes hands.
	c.Close()

	t.Run("primary disconnecting mid-command frees the slot", func(t *testing.T) {
		raw, err := net.Dial("unix", sb.sock)
		if err != nil {
			t.Fatal(err)
		}
		raw.Write([]byte("sleep 2; echo late > /tmp/late\n"))
		time.Sleep(300 * time.Millisecond)
		raw.Close()
		c2 := sb.dial()
		if body, exit := run(t, c2, "echo new primary"); exit != 0 || body != "new primary\n" {
			t.Fatalf("new primary: %q %d", body, exit)
		}
		// The abandoned command still ran to completion in the guest.
		time.Sleep(2 * time.Second)
		if body, _ := run(t, c2, "cat /tmp/late"); body != "late\n" {
			t.Fatalf("abandoned command did not complete: %q", body)
		}
		c2.Close()
	})

	t.Run("a wedged primary is dropped and the guest keeps running", func(t *testing.T) {
		raw, err := net.Dial("unix", sb.sock)
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		// Never read: 1 MiB of output cannot fit in the socket buffers.
		raw.Write([]byte("head -c 1048576 /dev/zero; date +%s > /tmp/wedge-done\n"))
		time.Sleep(500 * time.Millisecond)
		o := sb.dial()
		if _, exit := run(t, o, "true"); exit != -1 {
			t.Fatal("a second client became primary while the first was still connected")
		}
		o.Close()
		deadline := time.Now().Add(15 * time.Second)
		for {
			c3 := sb.dial()
			body, exit := run(t, c3, "cat /tmp/wedge-done")
			c3.Close()
			if exit == 0 && body != "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the wedged client was never dropped (last: %q %d)", body, exit)
			}
			time.Sleep(time.Second)
		}
		// The dropped client's socket is closed: reading gets EOF after the
		// bytes that did fit.
		raw.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.Copy(io.Discard, raw); err != nil {
			t.Fatalf("wedged client's connection was not closed: %v", err)
		}
	})

	t.Run("nether-ctl exit codes", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			exit int
			out  string
		}{
			{[]string{"echo", "hello", "world"}, 0, "hello world\n"},
			{[]string{"exit", "42"}, 42, ""},
			{[]string{"__bogus__"}, 125, ""},
		} {
			cmd := exec.Command(ctlBin, append([]string{sb.sock}, tc.args...)...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if code != tc.exit || (tc.out != "" && stdout.String() != tc.out) {
				t.Errorf("%v: exit %d stdout %q stderr %q; want exit %d", tc.args, code, stdout.String(), stderr.String(), tc.exit)
			}
			if tc.exit == 125 && !strings.HasPrefix(stderr.String(), "ERR ") && !strings.Contains(stderr.String(), "ERR ") {
				t.Errorf("control error not on stderr: %q", stderr.String())
			}
		}
	})
}

func hasLine(body, line string) bool {
	for _, l := range strings.Split(body, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

func hexString(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, x := range b {
		out = append(out, digits[x>>4], digits[x&15])
	}
	return string(out)
}

type firstByteWriter struct {
	mu    sync.Mutex
	first time.Time
	n     int
}

func (w *firstByteWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.first.IsZero() && len(p) > 0 {
		w.first = time.Now()
	}
	w.n += len(p)
	return len(p), nil
}
