package e2e

import (
	"crypto/rand"
	"crypto/sha256"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/testharness"
)

// TestChannelLane: a fork's transfers go through the channel's bulk lane
// both ways (nether's debug log counts its batches) and arrive whole; so
// do those of a fork of that fork, whose lane came back from its
// parent's device state.
func TestChannelLane(t *testing.T) {
	t.Parallel()
	art := sharedBase(t)
	for gen := 1; gen <= 2; gen++ {
		dir := t.TempDir()
		sb := launch(t, testharness.Options{Dir: dir, Socket: filepath.Join(dir, "ctl.sock"),
			Conf: []string{"restore = 1", "restore_from = " + art}, Args: []string{"-log-level", "debug"}})
		sb.waitListening(10 * time.Second)
		c := sb.dial()
		data := make([]byte, 6<<20)
		rand.Read(data)
		sum := sha256.Sum256(data)
		os.WriteFile(filepath.Join(dir, "in.bin"), data, 0o600)
		if body, exit := run(t, c, "__put__ in.bin /tmp/lane"); exit != 0 || !strings.HasPrefix(body, "OK") {
			t.Fatalf("generation %d: put: %q %d", gen, body, exit)
		}
		if body := mustRun(t, c, "sha256sum /tmp/lane"); !strings.HasPrefix(body, hexString(sum[:])) {
			t.Fatalf("generation %d: guest checksum %q, want %x", gen, body, sum)
		}
		if body, exit := run(t, c, "__get__ /tmp/lane out.bin"); exit != 0 || !strings.HasPrefix(body, "OK") {
			t.Fatalf("generation %d: get: %q %d", gen, body, exit)
		}
		if back, err := os.ReadFile(filepath.Join(dir, "out.bin")); err != nil || sha256.Sum256(back) != sum {
			t.Fatalf("generation %d: host copy differs (%d bytes, err %v)", gen, len(back), err)
		}
		out, in, refused := laneCounts(t, sb, "get")
		t.Logf("generation %d: lane batches out %d, in %d, refused %d", gen, out, in, refused)
		if out == 0 || in == 0 || refused != 0 {
			t.Fatalf("generation %d: the transfers did not go through the lane (batches out %d, in %d, refused %d)", gen, out, in, refused)
		}
		if gen == 1 {
			body, exit := run(t, c, "__snapshot__ child")
			if exit != 0 || !strings.HasPrefix(body, "OK snapshot child") {
				t.Fatalf("__snapshot__ of the fork: %q %d", body, exit)
			}
			art = filepath.Join(dir, "child")
		}
		shutdown(t, sb, c)
	}
}

var laneLine = regexp.MustCompile(`msg="transfer done" op=(\w+) .* lane_batches_out=(\d+) .*lane_batches_in=(\d+) .*lane_refused=(\d+)`)

// laneCounts reads the lane's counters from nether's last "transfer
// done" debug line, once that line is the one of op: nether logs it after
// the reply, and its stderr reaches the test through a pipe, so the line
// may come a moment after the reply did.
func laneCounts(t *testing.T, sb *sandbox, op string) (out, in, refused int) {
	t.Helper()
	var last []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if m := laneLine.FindAllStringSubmatch(sb.stderr.String(), -1); len(m) > 0 {
			last = m[len(m)-1]
			if last[1] == op {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no \"transfer done\" line for the %s in nether's debug log within 10 s (last: %q)", op, last)
		}
	}
	out, _ = strconv.Atoi(last[2])
	in, _ = strconv.Atoi(last[3])
	refused, _ = strconv.Atoi(last[4])
	return out, in, refused
}
