package e2e

// Hardening: faults a workload or a client can cause, against real
// guests restored from the shared base. After every fault the sandbox
// that is meant to survive must be whole again (faultBase.check): a fresh
// client's `echo ok` answers within 5 s, nether holds exactly the
// descriptors it held before the fault, and the launch directory holds
// nothing the fault left (no temporary file, no half-written target).

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
	"github.com/nethersandbox/nether/internal/testharness"
)

// ---------------------------------------------------------------------
// helpers

// freshOKWithin bounds a fresh client's `echo ok` after a fault, from
// its dial to its reply.
const freshOKWithin = 5 * time.Second

// faultBase is a surviving sandbox as it was before a fault: nether's
// descriptors with no client connected, and its launch directory.
type faultBase struct {
	sb  *sandbox
	fds map[int]string
	dir map[string]bool
}

// newFaultBase records sb's state. Every client of the test must be
// closed: the descriptor count is taken with none connected.
func newFaultBase(t *testing.T, sb *sandbox) *faultBase {
	t.Helper()
	fb := &faultBase{sb: sb, fds: quietFDs(t, sb), dir: map[string]bool{}}
	names, err := testharness.Entries(sb.dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		fb.dir[n] = true
	}
	t.Logf("baseline: nether holds %d descriptors with no client (%s)", len(fb.fds), testharness.FDKinds(fb.fds))
	return fb
}

// quietFDs returns nether's descriptor table once it has stopped
// changing (the same count for 300 ms): a client that just closed is
// dropped asynchronously.
func quietFDs(t *testing.T, sb *sandbox) map[int]string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last map[int]string
	same := 0
	for {
		fds, err := sb.h.FDs()
		if err != nil {
			t.Fatalf("reading nether's descriptors: %v", err)
		}
		if last != nil && len(fds) == len(last) {
			same++
		} else {
			same = 0
		}
		last = fds
		if same >= 6 {
			return fds
		}
		if time.Now().After(deadline) {
			t.Fatalf("nether's descriptor count never settled (now %d: %s)", len(fds), testharness.FDKinds(fds))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// check verifies that the sandbox survived a fault whole. Every client of
// the test must be closed. allowed names the entries the fault's test
// expects to have appeared in the launch directory (a snapshot it took,
// a transfer that succeeded); they become part of the baseline.
func (fb *faultBase) check(t *testing.T, what string, allowed ...string) {
	t.Helper()
	sb := fb.sb
	if sb.h.Exited() {
		t.Fatalf("after %s: nether exited (%v); stdout:\n%s", what, sb.h.Err(), sb.stdout.String())
	}
	// A fresh client's echo ok, within 5 s.
	took, err := freshEcho(sb, freshOKWithin)
	if err != nil {
		t.Errorf("after %s: a fresh `echo ok`: %v", what, err)
	} else {
		t.Logf("after %s: a fresh client's `echo ok` answered in %s", what, took.Round(time.Millisecond))
	}
	// Descriptors back to the baseline: exactly, no slack (the count is
	// taken with no client connected, before and after).
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds, err := sb.h.FDs()
		if err != nil {
			t.Fatalf("after %s: reading nether's descriptors: %v", what, err)
		}
		if len(fds) == len(fb.fds) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after %s: nether holds %d descriptors, %d before the fault (no client connected either time)\nbefore: %s\nnow:    %s\nnew or changed: %s",
				what, len(fds), len(fb.fds), testharness.FDKinds(fb.fds), testharness.FDKinds(fds), fdDiff(fb.fds, fds))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Nothing left in the launch directory.
	names, err := testharness.Entries(sb.dir)
	if err != nil {
		t.Fatal(err)
	}
	now := map[string]bool{}
	for _, n := range names {
		now[n] = true
		switch {
		case fb.dir[n]:
		case slices.Contains(allowed, n):
			fb.dir[n] = true
		case strings.HasPrefix(n, "."):
			t.Errorf("after %s: a hidden temporary file %q is left in the launch directory", what, n)
		default:
			t.Errorf("after %s: %q appeared in the launch directory", what, n)
		}
	}
	for n := range fb.dir {
		if !now[n] {
			t.Errorf("after %s: %q vanished from the launch directory", what, n)
			delete(fb.dir, n)
		}
	}
	for _, n := range allowed {
		if !now[n] {
			t.Errorf("after %s: %q, which the test expected, is not in the launch directory", what, n)
		}
	}
}

func fdDiff(before, after map[int]string) string {
	var out []string
	for fd, target := range after {
		if before[fd] != target {
			out = append(out, fmt.Sprintf("%d -> %s", fd, target))
		}
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// freshEcho connects a new client, takes the primary seat and runs
// `echo ok`, all within limit; it closes the client.
func freshEcho(sb *sandbox, limit time.Duration) (time.Duration, error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	observer := false
	for {
		c, err := client.Dial(ctx, sb.sock)
		if err != nil {
			if observer {
				return time.Since(began), fmt.Errorf("never got the primary seat (another client holds it?); last: %w", err)
			}
			return time.Since(began), err
		}
		var out bytes.Buffer
		exit, err := c.Run(ctx, "echo ok", &out)
		c.Close()
		var ce *client.ControlError
		if errors.As(err, &ce) && strings.Contains(ce.Msg, "read-only observer") {
			// The last primary's hang-up is not seen yet.
			observer = true
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			return time.Since(began), err
		}
		if exit != 0 || out.String() != "ok\n" {
			return time.Since(began), fmt.Errorf("got %q exit %d", out.String(), exit)
		}
		return time.Since(began), nil
	}
}

// runFor is run with its own deadline.
func runFor(t *testing.T, c *client.Client, line string, limit time.Duration) (string, int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var out bytes.Buffer
	exit, err := c.Run(ctx, line, &out)
	var ce *client.ControlError
	if errors.As(err, &ce) {
		return ce.Msg, exit, nil
	}
	return out.String(), exit, err
}

// rawPrimary connects a raw connection that holds the primary seat.
func rawPrimary(t *testing.T, sb *sandbox) *rawConn {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rc := rawDial(t, sb.sock)
		rc.send(t, "true")
		body, exit, err := rc.reply(30 * time.Second)
		if err == nil && exit == 0 {
			return rc
		}
		rc.Close()
		if err != nil || !strings.Contains(body, "read-only observer") || time.Now().After(deadline) {
			t.Fatalf("could not become primary: %q exit %d err %v", body, exit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readToEOF reads everything rc receives until the server closes it.
func readToEOF(rc *rawConn, timeout time.Duration) (string, error) {
	rc.SetReadDeadline(time.Now().Add(timeout))
	b, err := io.ReadAll(rc.r)
	return string(b), err
}

// readUntil reads until what has arrived contains want.
func readUntil(rc *rawConn, want string, timeout time.Duration) (string, error) {
	rc.SetReadDeadline(time.Now().Add(timeout))
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(want)) {
		n, err := rc.r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil {
			return string(got), err
		}
	}
	return string(got), nil
}

// waitTemp waits for the temporary file of a __get__ into target to
// appear in dir (and, when flowing, to hold bytes) and returns its name
// and size.
func waitTemp(t *testing.T, dir, target string, flowing bool) (string, int64) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		names, _ := testharness.Entries(dir)
		for _, n := range names {
			if strings.HasPrefix(n, "."+target+".") {
				fi, err := os.Stat(filepath.Join(dir, n))
				if err == nil && (!flowing || fi.Size() > 0) {
					return n, fi.Size()
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no temporary file for %s appeared within 30 s (launch directory: %v)", target, names)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stoppedReply checks a reply that a stop ended, read to the connection's
// end: whatever body came first (it must start with partial), then
// "ERR sandbox stopping: <reason...>" on a line of its own, then the
// trailer with exit -1, then nothing. It returns the ERR line.
func stoppedReply(t *testing.T, all, partial string) string {
	t.Helper()
	if strings.Count(all, "\x1e") != 1 || !strings.HasSuffix(all, "\x1e-1\n") {
		t.Fatalf("reply %q: want exactly one frame, ending in the trailer \\x1e-1\\n, then the end of the connection", tail(all, 400))
	}
	body := strings.TrimSuffix(all, "\x1e-1\n")
	if !strings.HasPrefix(body, partial) {
		t.Errorf("reply %q: want the partial output %q first", tail(all, 400), partial)
	}
	if !strings.HasSuffix(body, "\n") {
		t.Fatalf("reply %q: the ERR line does not end the body", tail(all, 400))
	}
	body = strings.TrimSuffix(body, "\n")
	i := strings.LastIndexByte(body, '\n')
	errLine := body[i+1:]
	if !strings.HasPrefix(errLine, "ERR sandbox stopping: ") {
		t.Errorf("reply %q: the last line is %q, want ERR sandbox stopping: <reason> on a line of its own", tail(all, 400), errLine)
	}
	return errLine
}

var recordFieldRE = regexp.MustCompile(`([a-z_]+)=(\d+)`)

// fieldsOf parses the key=number pairs of a line.
func fieldsOf(s string) map[string]int64 {
	m := map[string]int64{}
	for _, kv := range recordFieldRE.FindAllStringSubmatch(s, -1) {
		n, _ := strconv.ParseInt(kv[2], 10, 64)
		m[kv[1]] = n
	}
	return m
}

var reasonRE = regexp.MustCompile(`\(reason=([a-z_]+)\)`)

func reasonOf(line string) string {
	if m := reasonRE.FindStringSubmatch(line); m != nil {
		return m[1]
	}
	return ""
}

// okSnapshot takes a base snapshot at rel and fails the test unless it
// succeeds: a transfer that pinned the guest would keep it from being
// quiescent.
func okSnapshot(t *testing.T, c *client.Client, rel string) {
	t.Helper()
	body, exit, err := runFor(t, c, "__snapshot__ "+rel, 2*time.Minute)
	if err != nil || exit != 0 || !strings.HasPrefix(body, "OK snapshot "+rel+" kind=base ") {
		t.Errorf("__snapshot__ %s right after: %q exit %d err %v; want OK (nothing may pin the guest)", rel, body, exit, err)
	}
}

// ---------------------------------------------------------------------
// 1. Transfers that end

// TestHardeningTransfersEnd: a __get__ of something that would never end
// answers ERR and pins nothing; a __get__ whose client leaves is
// cancelled on the spot.
//
// The stalled __get__ (TestHardeningTransferStalls) is a test of its own:
// it waits out the host's 30 s stall timeout, with 15 s to spare, so it
// runs beside other tests instead of holding up the serial ones.
func TestHardeningTransfersEnd(t *testing.T) {
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	mustRun(t, c, "mkfifo /tmp/f && truncate -s 512M /tmp/sparse")
	c.Close()
	fb := newFaultBase(t, sb)
	transfersEnd(t, sb, fb, "FIFO", "/tmp/f", 10*time.Second, "not a regular file")
	transfersLeft(t, sb, fb)
}

// TestHardeningTransferStalls: a __get__ of a file that is S_IFREG but
// whose read finds nothing for ever once the kernel's buffer is drained
// (/proc/kmsg) is ended by the host's stall timeout (30 s) with an ERR,
// and pins nothing.
func TestHardeningTransferStalls(t *testing.T) {
	t.Parallel()
	sb := forkOf(t, sharedBase(t))
	// A first command, as in TestHardeningTransfersEnd: the baseline's
	// descriptors are those of a sandbox whose restore has finished.
	c := sb.dial()
	mustRun(t, c, "true")
	c.Close()
	fb := newFaultBase(t, sb)
	transfersEnd(t, sb, fb, "proc-kmsg", "/proc/kmsg", 45*time.Second, "")
}

// transfersEnd: a __get__ of path answers a framed ERR saying want within
// the bound, and a snapshot after it finds nothing pinned.
func transfersEnd(t *testing.T, sb *sandbox, fb *faultBase, name, path string, within time.Duration, want string) {
	t.Helper()
	t.Run("get of "+name, func(t *testing.T) {
		c := primaryClient(t, sb)
		began := time.Now()
		body, exit, err := runFor(t, c, "__get__ "+path+" out-"+name, 2*time.Minute)
		took := time.Since(began)
		t.Logf("__get__ %s: %q exit %d after %s", path, body, exit, took.Round(time.Millisecond))
		if err != nil {
			t.Fatalf("__get__ %s: no reply: %v", path, err)
		}
		if exit != -1 || !strings.HasPrefix(body, "ERR ") || !strings.Contains(body, want) {
			t.Errorf("__get__ %s: %q exit %d; want a framed ERR (exit -1) saying %q", path, body, exit, want)
		}
		if took > within {
			t.Errorf("__get__ %s answered after %s, want within %s", path, took, within)
		}
		okSnapshot(t, c, "snap-"+name)
		c.Close()
		fb.check(t, "__get__ "+path, "snap-"+name)
	})
}

// transfersLeft: a __get__ whose client leaves is cancelled on the spot,
// idle or streaming.
func transfersLeft(t *testing.T, sb *sandbox, fb *faultBase) {
	t.Helper()
	for _, tc := range []struct {
		name, path string
		flowing    bool // wait for bytes to arrive before leaving
	}{
		{"idle (proc-kmsg)", "/proc/kmsg", false},
		{"streaming (512 MiB)", "/tmp/sparse", true},
	} {
		t.Run("client leaves a get: "+tc.name, func(t *testing.T) {
			target := "left-" + strings.Fields(tc.name)[0]
			rc := rawPrimary(t, sb)
			rc.send(t, "__get__ "+tc.path+" "+target)
			// The transfer is under way once its temporary file exists
			// (and, streaming, has bytes in it).
			tmp, size := waitTemp(t, sb.dir, target, tc.flowing)
			rc.Close()
			left := time.Now()
			for {
				if _, err := os.Lstat(filepath.Join(sb.dir, tmp)); errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Since(left) > 5*time.Second {
					t.Fatalf("the temporary file %s is still there 5 s after its client left", tmp)
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("left with %s holding %d bytes; it was removed %s later", tmp, size, time.Since(left).Round(time.Millisecond))
			c := primaryClient(t, sb)
			okSnapshot(t, c, "snap-"+target)
			c.Close()
			fb.check(t, "a client leaving its __get__ of "+tc.path, "snap-"+target)
		})
	}
}

// TestHardeningTransferLimit: with max_transfer_bytes = 1048576, a
// transfer over it is refused, naming the limit, and leaves nothing; one
// at it goes through; __info__ reports both limits.
func TestHardeningTransferLimit(t *testing.T) {
	const limit = 1 << 20
	sb := forkOf(t, sharedBase(t), "max_transfer_bytes = 1048576", "console_log_max_bytes = 65536")
	c := sb.dial()
	info := sb.info(c)
	if info["max_transfer_bytes"] != "1048576" || info["console_log_max_bytes"] != "65536" {
		t.Errorf("__info__ max_transfer_bytes=%q console_log_max_bytes=%q, want 1048576 and 65536", info["max_transfer_bytes"], info["console_log_max_bytes"])
	}
	mustRun(t, c, "truncate -s 100G /tmp/big && head -c 1048576 /dev/urandom > /tmp/at && head -c 1048577 /dev/zero > /tmp/over")
	atSum := strings.Fields(mustRun(t, c, "sha256sum /tmp/at"))[0]
	c.Close()
	at := make([]byte, limit)
	rand.Read(at)
	for name, data := range map[string][]byte{"at.bin": at, "over.bin": make([]byte, limit+1), "keep": []byte("keep me\n")} {
		if err := os.WriteFile(filepath.Join(sb.dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A sparse host file of 100 GiB: copying it is out of the question,
	// so only a refusal before copying answers quickly.
	f, err := os.Create(filepath.Join(sb.dir, "huge.bin"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(100 << 30); err != nil {
		t.Fatal(err)
	}
	f.Close()
	fb := newFaultBase(t, sb)

	for _, tc := range []struct {
		name, line string
		want       []string // in the ERR; nil: must succeed
		within     time.Duration
		guest      string // a guest check that must print "clean"
	}{
		{"get of a 100 GiB sparse guest file", "__get__ /tmp/big big", []string{"1048576"}, 10 * time.Second, ""},
		{"get one byte over", "__get__ /tmp/over over", []string{"1048576"}, 10 * time.Second, ""},
		// st_size 0, megabytes when read: refused once the bytes pass it.
		{"get of a file whose size says 0", "__get__ /proc/kallsyms kallsyms", []string{"1048576"}, 30 * time.Second, ""},
		{"put of a 100 GiB sparse host file", "__put__ huge.bin /tmp/huge", []string{"107374182400", "max_transfer_bytes=1048576"}, 5 * time.Second,
			"[ ! -e /tmp/huge ] && ! ls -a /tmp | grep -q nether && echo clean"},
		{"put one byte over", "__put__ over.bin /tmp/over-put", []string{"1048577", "1048576"}, 10 * time.Second,
			"[ ! -e /tmp/over-put ] && ! ls -a /tmp | grep -q nether && echo clean"},
		// A refused get leaves the host file it would have replaced as
		// it was.
		{"refused get onto an existing file", "__get__ /tmp/over keep", []string{"1048576"}, 10 * time.Second, ""},
		{"get at the limit", "__get__ /tmp/at at", nil, 30 * time.Second, ""},
		{"put at the limit", "__put__ at.bin /tmp/at-put", nil, 30 * time.Second, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := primaryClient(t, sb)
			began := time.Now()
			body, exit, err := runFor(t, c, tc.line, 2*time.Minute)
			took := time.Since(began)
			t.Logf("%s: %q exit %d after %s", tc.line, body, exit, took.Round(time.Millisecond))
			if err != nil {
				t.Fatalf("%s: no reply: %v", tc.line, err)
			}
			var allowed []string
			if tc.want == nil {
				if exit != 0 || !strings.HasPrefix(body, "OK ") || !strings.Contains(body, " 1048576 bytes") {
					t.Errorf("%s: %q exit %d; want OK ... 1048576 bytes", tc.line, body, exit)
				}
			} else {
				if exit != -1 || !strings.HasPrefix(body, "ERR ") {
					t.Errorf("%s: %q exit %d; want a framed ERR (exit -1)", tc.line, body, exit)
				}
				for _, w := range tc.want {
					if !strings.Contains(body, w) {
						t.Errorf("%s: ERR %q does not say %q", tc.line, body, w)
					}
				}
			}
			if took > tc.within {
				t.Errorf("%s answered after %s, want within %s", tc.line, took, tc.within)
			}
			if tc.guest != "" {
				if got := mustRun(t, c, tc.guest); got != "clean\n" {
					t.Errorf("the guest after %s: %q; want no target and no temporary file", tc.line, got)
				}
			}
			switch tc.line {
			case "__get__ /tmp/over keep":
				if b, err := os.ReadFile(filepath.Join(sb.dir, "keep")); err != nil || string(b) != "keep me\n" {
					t.Errorf("the refused get changed the existing file: %q %v", b, err)
				}
			case "__get__ /tmp/at at":
				allowed = []string{"at"}
				b, err := os.ReadFile(filepath.Join(sb.dir, "at"))
				if sum := sha256.Sum256(b); err != nil || hexString(sum[:]) != atSum {
					t.Errorf("the host copy of /tmp/at differs (%d bytes, err %v)", len(b), err)
				}
			case "__put__ at.bin /tmp/at-put":
				sum := sha256.Sum256(at)
				if got := mustRun(t, c, "sha256sum < /tmp/at-put"); !strings.HasPrefix(got, hexString(sum[:])) {
					t.Errorf("the guest copy of at.bin differs: %q", got)
				}
			}
			c.Close()
			fb.check(t, tc.line, allowed...)
		})
	}
}

// ---------------------------------------------------------------------
// 2. The console never stalls the guest

// TestHardeningConsole: a guest that floods its console is not slowed by
// the log, console.log stays within console_log_max_bytes and keeps the
// newest output; on a full disk the guest goes on and the log resumes
// once there is room.
func TestHardeningConsole(t *testing.T) {
	// flood writes n lines of about 1 KB ("line <i> " and a filler) to
	// the console in one stream: long lines are the fastest way through
	// the emulated UART (about 170 KB/s under TCG here).
	flood := func(n int) string {
		return fmt.Sprintf(`awk 'BEGIN { p = ""; for (j = 0; j < 100; j++) p = p "-xxxxxxxx-"; for (i = 1; i <= %d; i++) print "line " i " " p }' > /dev/console; echo flooded`, n)
	}
	filler := strings.Repeat("-xxxxxxxx-", 100)
	art := sharedBase(t)

	t.Run("flood with console_log_max_bytes = 65536", func(t *testing.T) {
		sb := forkOf(t, art, "console_log_max_bytes = 65536")
		log := filepath.Join(sb.dir, "console.log")
		c := sb.dial()
		mustRun(t, c, "true")
		c.Close()
		fb := newFaultBase(t, sb)
		// Watch the log's size all along, not just at the end.
		var maxSize int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				if fi, err := os.Stat(log); err == nil && fi.Size() > maxSize {
					maxSize = fi.Size()
				}
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
		c = primaryClient(t, sb)
		began := time.Now()
		// 2 MB, 32 times the log's bound: enough to wrap it many times
		// over (5 MB took 51 s of the suite for nothing more).
		const lines = 2000
		body, exit, err := runFor(t, c, flood(lines), 3*time.Minute)
		took := time.Since(began)
		close(stop)
		wg.Wait()
		if err != nil || exit != 0 || body != "flooded\n" {
			t.Fatalf("flooding the console: %q exit %d err %v after %s", body, exit, err, took)
		}
		t.Logf("the guest wrote %d lines (%d KB) to its console in %s; console.log peaked at %d bytes", lines, lines, took.Round(time.Millisecond), maxSize)
		if took > 90*time.Second {
			t.Errorf("flooding the console took %s: the console pushes back on the guest", took)
		}
		c.Close()
		fb.check(t, "a console flood")
		b, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 65536 || maxSize > 65536 {
			t.Errorf("console.log is %d bytes (peak %d), over console_log_max_bytes = 65536", len(b), maxSize)
		}
		// It ends with the newest output: the flood's last lines, in order.
		got := strings.Split(strings.TrimRight(strings.ReplaceAll(string(b), "\r", ""), "\n"), "\n")
		const last = 30 // 30 KB: well inside what a 64 KiB log keeps
		if len(got) < last {
			t.Fatalf("console.log holds %d lines: %q", len(got), tail(string(b), 500))
		}
		for i, l := range got[len(got)-last:] {
			if want := fmt.Sprintf("line %d %s", lines-last+1+i, filler); l != want {
				t.Fatalf("console.log's last %d lines: line %d is %q, want %q", last, i, tail(l, 80), tail(want, 80))
			}
		}
	})

	t.Run("full disk", func(t *testing.T) {
		if os.Getuid() != 0 {
			t.Skip("SKIPPED: needs root to mount a small tmpfs as the launch directory")
		}
		dir, err := os.MkdirTemp("", "nether-consolefull-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", dir).CombinedOutput(); err != nil {
			t.Skipf("SKIPPED: cannot mount a tmpfs here: %v %s", err, out)
		}
		// Registered before the sandbox, so it runs after nether stopped.
		t.Cleanup(func() {
			if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
				t.Logf("umount %s: %v %s; detaching it", dir, err, out)
				exec.Command("umount", "-l", dir).Run()
			}
		})
		sb := restoreIn(t, dir, art, "console_log_max_bytes = 0")
		log := filepath.Join(dir, "console.log")
		c := sb.dial()
		mustRun(t, c, "true")
		c.Close()
		// Fill the disk but for 256 KiB: the flood fills the rest.
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			t.Fatal(err)
		}
		ballast := filepath.Join(dir, "ballast")
		if err := os.WriteFile(ballast, make([]byte, int64(st.Bavail)*st.Bsize-256<<10), 0o600); err != nil {
			t.Fatal(err)
		}
		fb := newFaultBase(t, sb)
		before, _ := os.Stat(log)

		c = primaryClient(t, sb)
		began := time.Now()
		body, exit, err := runFor(t, c, flood(1000), 3*time.Minute) // 1 MB, four times the room left
		took := time.Since(began)
		if err != nil || exit != 0 || body != "flooded\n" {
			t.Fatalf("flooding the console on a full disk: %q exit %d err %v after %s", body, exit, err, took)
		}
		full, _ := os.Stat(log)
		syscall.Statfs(dir, &st)
		t.Logf("the guest wrote 1 MB to its console in %s, filling the disk; console.log %d -> %d bytes, %d bytes free",
			took.Round(time.Millisecond), before.Size(), full.Size(), int64(st.Bavail)*st.Bsize)
		if int64(st.Bavail)*st.Bsize >= 64<<10 {
			t.Errorf("the disk is not full after the flood (%d bytes free): the test did not test a full disk", int64(st.Bavail)*st.Bsize)
		}
		if took > time.Minute {
			t.Errorf("flooding the console on a full disk took %s: the console pushes back on the guest", took)
		}
		c.Close()
		fb.check(t, "a console flood on a full disk")

		// Room again: the log resumes.
		if err := os.Remove(ballast); err != nil {
			t.Fatal(err)
		}
		delete(fb.dir, "ballast")
		marker := fmt.Sprintf("resumed-%d", time.Now().UnixNano())
		c = primaryClient(t, sb)
		mustRun(t, c, "echo "+marker+" > /dev/console")
		c.Close()
		deadline := time.Now().Add(5 * time.Second)
		for {
			b, _ := os.ReadFile(log)
			if bytes.Contains(b, []byte(marker)) {
				t.Logf("console.log resumed once there was room (%d bytes)", len(b))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("console.log did not resume within 5 s of space being freed (%d bytes, tail %q)", len(b), tail(string(b), 200))
			}
			time.Sleep(20 * time.Millisecond)
		}
		fb.check(t, "freeing space")
	})
}

// ---------------------------------------------------------------------
// 3. Every command answered

// TestHardeningStopAnswers: a command in flight when the sandbox stops
// gets its partial output, then a framed ERR sandbox stopping: <reason>
// (exit -1), then the end of the connection; a transfer in flight gets
// the same ERR and leaves no temporary file behind.
func TestHardeningStopAnswers(t *testing.T) {
	art := sharedBase(t)
	sigterm := func(t *testing.T, sb *sandbox) { sb.h.Signal(syscall.SIGTERM) }
	killQEMU := func(t *testing.T, sb *sandbox) {
		if err := sb.qemu().Signal(syscall.SIGKILL); err != nil {
			t.Fatalf("SIGKILL QEMU: %v", err)
		}
	}
	isSigterm := func(r string) bool { return r == "sigterm" }
	isFailure := func(r string) bool { return r != "" && r != "sigterm" && r != "shutdown" && r != "poweroff" }
	const streaming = "echo start; i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.05; done"
	for _, tc := range []struct {
		name, line string
		partial    string // output to wait for before the fault
		getInto    string // a __get__: wait for its temporary file to hold bytes
		stop       func(t *testing.T, sb *sandbox)
		reason     func(string) bool // the final record's reason
		exitZero   bool
		exactErr   string // the whole ERR line, when it is known
	}{
		{"SIGTERM during sleep", "sleep 20", "", "", sigterm, isSigterm, true, "ERR sandbox stopping: sigterm"},
		{"SIGTERM after partial output", "echo start; sleep 20", "start\n", "", sigterm, isSigterm, true, "ERR sandbox stopping: sigterm"},
		{"SIGTERM during a streaming get", "__get__ /tmp/sparse out", "", "out", sigterm, isSigterm, true, "ERR sandbox stopping: sigterm"},
		{"SIGTERM during an idle get", "__get__ /proc/kmsg out", "", "out", sigterm, isSigterm, true, "ERR sandbox stopping: sigterm"},
		{"QEMU killed while streaming", streaming, "start\n", "", killQEMU, isFailure, false, ""},
		{"QEMU killed during a streaming get", "__get__ /tmp/sparse out", "", "out", killQEMU, isFailure, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := forkOf(t, art)
			c := sb.dial()
			mustRun(t, c, "truncate -s 1G /tmp/sparse")
			c.Close()
			rc := rawPrimary(t, sb)
			rc.send(t, tc.line)
			first := ""
			switch {
			case tc.partial != "":
				got, err := readUntil(rc, tc.partial, 30*time.Second)
				if err != nil {
					t.Fatalf("%q did not start: %q %v", tc.line, got, err)
				}
				first = got
			case tc.getInto != "":
				tmp, size := waitTemp(t, sb.dir, tc.getInto, strings.Contains(tc.line, "sparse"))
				t.Logf("the get is under way: %s holds %d bytes", tmp, size)
			default:
				time.Sleep(500 * time.Millisecond) // the command runs
			}
			began := time.Now()
			tc.stop(t, sb)
			rest, err := readToEOF(rc, 20*time.Second)
			took := time.Since(began)
			if err != nil {
				t.Fatalf("the reply did not end with the connection within 20 s: %v (got %q)", err, tail(first+rest, 400))
			}
			errLine := stoppedReply(t, first+rest, tc.partial)
			t.Logf("%s: %q then the end of the connection, %s after the fault", tc.name, errLine, took.Round(time.Millisecond))
			line := sb.wait(30 * time.Second)
			reason := reasonOf(line)
			if !tc.reason(reason) {
				t.Errorf("final record %q: unexpected reason", line)
			}
			if want := "ERR sandbox stopping: " + reason; !strings.HasPrefix(errLine, want) {
				t.Errorf("the reply's ERR %q does not give the session's stop reason (%s)", errLine, want)
			}
			if tc.exactErr != "" && errLine != tc.exactErr {
				t.Errorf("ERR line %q, want exactly %q", errLine, tc.exactErr)
			}
			if code := sb.h.ExitCode(); (code == 0) != tc.exitZero {
				t.Errorf("nether exit status %d (want zero: %v); final record %q", code, tc.exitZero, line)
			}
			t.Logf("nether ended with status %d: %s", sb.h.ExitCode(), line)
			sb.checkNoLeftovers()
			if tc.getInto != "" {
				if _, err := os.Lstat(filepath.Join(sb.dir, tc.getInto)); err == nil {
					t.Errorf("the interrupted __get__ left its target %s", tc.getInto)
				}
			}
		})
	}
}

// TestHardeningStopAnswersQueued: lines a client sent behind a running
// command are each answered, in order, when the sandbox stops.
func TestHardeningStopAnswersQueued(t *testing.T) {
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	mustRun(t, c, "true")
	c.Close()
	rc := rawPrimary(t, sb)
	rc.send(t, "echo start; sleep 20\necho queued-1\n__get__ /etc/hostname queued-2")
	if got, err := readUntil(rc, "start\n", 30*time.Second); err != nil {
		t.Fatalf("the command did not start: %q %v", got, err)
	}
	time.Sleep(200 * time.Millisecond) // the queued lines are read
	sb.h.Signal(syscall.SIGTERM)
	rest, err := readToEOF(rc, 20*time.Second)
	if err != nil {
		t.Fatalf("the replies did not end with the connection within 20 s: %v (got %q)", err, rest)
	}
	const stop = "ERR sandbox stopping: sigterm\n\x1e-1\n"
	if want := "\n" + stop + stop + stop; rest != want {
		t.Errorf("after start: %q; want the running command's ERR on a line of its own, then one ERR for each queued line, then the end", rest)
	}
	if line := sb.wait(30 * time.Second); reasonOf(line) != "sigterm" {
		t.Errorf("final record %q, want reason=sigterm", line)
	}
	sb.checkNoLeftovers()
	if _, err := os.Lstat(filepath.Join(sb.dir, "queued-2")); err == nil {
		t.Errorf("a queued __get__ ran after the stop began")
	}
}

// ---------------------------------------------------------------------
// 4. Honest stop reasons

// TestHardeningGuestEnds: a guest that ends itself ends nether with the
// reason that is true: a kernel panic is guest_panic and a reset nobody
// asked for guest_crash (both a non-zero exit), a power-off is poweroff
// (exit 0). The command that ended it is answered with that reason.
func TestHardeningGuestEnds(t *testing.T) {
	art := sharedBase(t)
	for _, tc := range []struct {
		name, line, reason string
		exitZero           bool
	}{
		{"kernel panic", "echo c > /proc/sysrq-trigger", "guest_panic", false},
		{"reset", "echo b > /proc/sysrq-trigger", "guest_crash", false},
		{"power off", "echo o > /proc/sysrq-trigger; sleep 20", "poweroff", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sb := forkOf(t, art)
			c := sb.dial()
			mustRun(t, c, "true")
			c.Close()
			rc := rawPrimary(t, sb)
			began := time.Now()
			rc.send(t, tc.line)
			all, err := readToEOF(rc, 30*time.Second)
			if err != nil {
				t.Fatalf("the reply to %q did not end within 30 s: %v (got %q)", tc.line, err, all)
			}
			errLine := stoppedReply(t, all, "")
			line := sb.wait(30 * time.Second)
			t.Logf("%s: reply %q; nether ended %s later with status %d: %s", tc.name, errLine, time.Since(began).Round(time.Millisecond), sb.h.ExitCode(), line)
			if reasonOf(line) != tc.reason {
				t.Errorf("final record %q, want reason=%s", line, tc.reason)
			}
			if !strings.HasPrefix(errLine, "ERR sandbox stopping: "+tc.reason) {
				t.Errorf("reply %q, want ERR sandbox stopping: %s...", errLine, tc.reason)
			}
			if code := sb.h.ExitCode(); (code == 0) != tc.exitZero {
				t.Errorf("nether exit status %d after a guest %s (want zero: %v)", code, tc.name, tc.exitZero)
			}
			sb.checkNoLeftovers()
		})
	}
}

// TestHardeningGuestSignalsToInit: a workload's signals to PID 1 (the
// agent) do not end the sandbox. (SIGKILL and SIGSTOP are never delivered
// to a namespace's init from inside it: not tested.)
func TestHardeningGuestSignalsToInit(t *testing.T) {
	t.Parallel()
	art := sharedBase(t)
	var sb *sandbox
	var fb *faultBase
	top := t // the sandbox outlives each case
	for _, sig := range []string{"TERM", "INT", "HUP", "QUIT", "USR1", "USR2", "ALRM", "PIPE"} {
		t.Run("SIG"+sig, func(t *testing.T) {
			if sb == nil || sb.h.Exited() {
				// The first case, or the last one took the sandbox down.
				if sb != nil {
					t.Logf("a fresh sandbox: the last one ended")
				}
				sb = forkOf(top, art)
				c := sb.dial()
				mustRun(t, c, "true")
				c.Close()
				fb = newFaultBase(t, sb)
			}
			c := primaryClient(t, sb)
			body, exit, err := runFor(t, c, "kill -"+sig+" 1 && sleep 0.5 && echo sent", 30*time.Second)
			c.Close()
			if err != nil || exit != 0 || body != "sent\n" {
				t.Errorf("kill -%s 1: %q exit %d err %v", sig, body, exit, err)
			}
			fb.check(t, "kill -"+sig+" 1")
		})
	}
}

// ---------------------------------------------------------------------
// 5. Byte-exact

// TestHardeningBytes: bytes that are not UTF-8 reach the guest and come
// back exactly, in command lines, in transfer paths and in output.
func TestHardeningBytes(t *testing.T) {
	t.Parallel()
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()

	t.Run("command line", func(t *testing.T) {
		body, exit := run(t, c, "printf '%s' 'caf\xe9' | od -An -tx1")
		if got := strings.Fields(body); exit != 0 || !slices.Equal(got, []string{"63", "61", "66", "e9"}) {
			t.Errorf("printf of a raw 0xe9 byte: %q exit %d; want 63 61 66 e9", body, exit)
		}
	})

	t.Run("put and get paths", func(t *testing.T) {
		if err := os.WriteFile(filepath.Join(sb.dir, "in.txt"), []byte("hello\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if body, exit := run(t, c, "__put__ in.txt /tmp/caf\xe9"); exit != 0 || !strings.HasPrefix(body, "OK ") {
			t.Fatalf("__put__ to /tmp/caf\\xe9: %q exit %d", body, exit)
		}
		// Exactly one name starting caf, and it is 63 61 66 e9. (Not
		// through ls: busybox ls shows a byte it cannot print as "?",
		// whatever the name holds.)
		if body, exit := run(t, c, "cd /tmp && for f in caf*; do printf '%s\\n' \"$f\"; done | od -An -tx1"); exit != 0 || !slices.Equal(strings.Fields(body), []string{"63", "61", "66", "e9", "0a"}) {
			t.Errorf("the names in /tmp that start caf, in hex: %q exit %d; want 63 61 66 e9 0a", body, exit)
		}
		if body, exit := run(t, c, "cat /tmp/caf\xe9"); exit != 0 || body != "hello\n" {
			t.Errorf("cat /tmp/caf\\xe9: %q exit %d", body, exit)
		}
		if body, exit := run(t, c, "__get__ /tmp/caf\xe9 back\xe9"); exit != 0 || !strings.HasPrefix(body, "OK ") {
			t.Fatalf("__get__ /tmp/caf\\xe9 back\\xe9: %q exit %d", body, exit)
		}
		if b, err := os.ReadFile(filepath.Join(sb.dir, "back\xe9")); err != nil || string(b) != "hello\n" {
			t.Errorf("host file back\\xe9: %q %v", b, err)
		}
	})

	t.Run("output", func(t *testing.T) {
		all := make([]byte, 256)
		for i := range all {
			all[i] = byte(i)
		}
		if err := os.WriteFile(filepath.Join(sb.dir, "all.bin"), all, 0o600); err != nil {
			t.Fatal(err)
		}
		if body, exit := run(t, c, "__put__ all.bin /tmp/all"); exit != 0 {
			t.Fatalf("__put__ all.bin: %q", body)
		}
		if body, exit := run(t, c, "cat /tmp/all"); exit != 0 || body != string(all) {
			t.Errorf("cat of the 256 byte values: exit %d, %d bytes %q", exit, len(body), body)
		}
	})
}

// ---------------------------------------------------------------------
// 6. The jail guards nether's own files

// TestHardeningJailGuards: transfers may not replace nether.conf,
// console.log or the control socket, nor write into a snapshot artifact
// (committed or being written); a __put__ onto /dev/null is refused and
// leaves it a character device.
func TestHardeningJailGuards(t *testing.T) {
	t.Parallel()
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	takeSnapshot(t, sb, c, "snap")
	c.Close()
	// What a capture in progress looks like: a hidden .partial- directory.
	partial := ".pending.partial-0123456789abcdef"
	if err := os.Mkdir(filepath.Join(sb.dir, partial), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sb.dir, "payload"), []byte("payload\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	fb := newFaultBase(t, sb)
	fb.dir[partial] = true // the test's own, hidden on purpose
	before := jailState(t, sb)

	for _, line := range []string{
		"__get__ /etc/hostname nether.conf",
		"__get__ /etc/hostname ./nether.conf",
		"__get__ /etc/hostname console.log",
		"__get__ /etc/hostname ctl.sock",
		"__get__ /etc/hostname snap/meta.json",
		"__get__ /etc/hostname snap/COMMITTED",
		"__get__ /etc/hostname snap/new",
		"__get__ /etc/hostname " + partial + "/x",
		"__put__ payload /dev/null",
	} {
		t.Run(line, func(t *testing.T) {
			c := primaryClient(t, sb)
			body, exit, err := runFor(t, c, line, 30*time.Second)
			t.Logf("%s: %q exit %d", line, body, exit)
			if err != nil || exit != -1 || !strings.HasPrefix(body, "ERR ") {
				t.Errorf("%s: %q exit %d err %v; want a framed ERR (exit -1)", line, body, exit, err)
			}
			if got := mustRun(t, c, "[ -c /dev/null ] && echo chr; echo x > /dev/null; wc -c < /dev/null"); got != "chr\n0\n" {
				t.Errorf("after %s: /dev/null: %q, want a character device that stays empty", line, got)
			}
			c.Close()
			if after := jailState(t, sb); after != before {
				t.Errorf("%s changed nether's files:\nbefore: %s\nafter:  %s", line, before, after)
			}
			fb.check(t, line)
		})
	}
	mustValidate(t, filepath.Join(sb.dir, "snap"), "base")
}

// jailState fingerprints what the jail guards: nether.conf (content and
// inode), console.log and the control socket (inode and type), and every
// file of the snapshot artifact and of the partial directory.
func jailState(t *testing.T, sb *sandbox) string {
	t.Helper()
	var b strings.Builder
	ident := func(rel string) {
		fi, err := os.Lstat(filepath.Join(sb.dir, rel))
		if err != nil {
			fmt.Fprintf(&b, "%s: %v; ", rel, err)
			return
		}
		st := fi.Sys().(*syscall.Stat_t)
		fmt.Fprintf(&b, "%s: ino %d %s", rel, st.Ino, fi.Mode().Type())
		if fi.Mode().IsRegular() && rel != "console.log" {
			fmt.Fprintf(&b, " size %d mtime %d", fi.Size(), fi.ModTime().UnixNano())
			if fi.Size() <= 1<<20 { // not the artifact's RAM
				data, _ := os.ReadFile(filepath.Join(sb.dir, rel))
				fmt.Fprintf(&b, " sha256 %x", sha256.Sum256(data))
			}
		}
		b.WriteString("; ")
	}
	ident("nether.conf")
	ident("console.log")
	ident("ctl.sock")
	for _, d := range []string{"snap", ".pending.partial-0123456789abcdef"} {
		names, err := testharness.Entries(filepath.Join(sb.dir, d))
		if err != nil {
			fmt.Fprintf(&b, "%s: %v; ", d, err)
		}
		for _, n := range names {
			ident(d + "/" + n)
		}
	}
	if ok, err := testharness.Listening(sb.sock); !ok || err != nil {
		fmt.Fprintf(&b, "ctl.sock not listening (%v); ", err)
	}
	return b.String()
}

// ---------------------------------------------------------------------
// 7. One bill

// TestHardeningOneBill: the OK parked reply and the session's final
// record carry the same figures.
func TestHardeningOneBill(t *testing.T) {
	t.Parallel()
	sb := forkOf(t, sharedBase(t))
	c := sb.dial()
	mustRun(t, c, "echo some work; head -c 300000 /dev/zero | wc -c; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
	if err := os.WriteFile(filepath.Join(sb.dir, "in.bin"), bytes.Repeat([]byte("x"), 100000), 0o600); err != nil {
		t.Fatal(err)
	}
	if body, exit := run(t, c, "__put__ in.bin /tmp/in.bin"); exit != 0 {
		t.Fatalf("__put__: %q", body)
	}
	if body, exit := run(t, c, "__get__ /tmp/in.bin out.bin"); exit != 0 {
		t.Fatalf("__get__: %q", body)
	}
	body, exit := run(t, c, "__park__ p")
	if exit != 0 || !strings.HasPrefix(body, "OK parked p ") {
		t.Fatalf("__park__: %q exit %d", body, exit)
	}
	line := sb.wait(30 * time.Second)
	t.Logf("reply:  %s", strings.TrimSpace(body))
	t.Logf("record: %s", line)
	if reasonOf(line) != "park" {
		t.Errorf("final record %q, want reason=park", line)
	}
	parked, final := fieldsOf(body), fieldsOf(line)
	for _, k := range []string{"uptime_ms", "cpu_ms", "mem_peak_mb", "commands", "bytes_in", "bytes_out"} {
		p, ok1 := parked[k]
		f, ok2 := final[k]
		if !ok1 || !ok2 || p != f {
			t.Errorf("%s: OK parked says %d (present %v), the final record %d (present %v); one session, one bill", k, p, ok1, f, ok2)
		}
	}
	if parked["commands"] < 3 || parked["cpu_ms"] == 0 || parked["bytes_out"] == 0 {
		t.Errorf("the bill %q does not show the session's work (commands >= 3, cpu_ms > 0, bytes_out > 0)", body)
	}
}
