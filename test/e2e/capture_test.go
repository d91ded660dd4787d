package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

// busyWriter appends a numbered line to /tmp/busy every few milliseconds,
// in the background, from a shell that forks a sleep each time: the guest
// and its kernel write memory all the while a capture runs.
const busyWriter = `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i >> /tmp/busy; sleep 0.01; done' >/dev/null 2>&1 &`

// checkBusyFile reads /tmp/busy in a restored guest: it must be the lines
// 1..n in order (the writer goes on appending while it is read, so only
// the lines read count), and the guest must run commands.
func checkBusyFile(t *testing.T, sb *sandbox, what string) int {
	t.Helper()
	c := sb.dial()
	defer c.Close()
	out := mustRun(t, c, `n=0; while read l; do n=$((n+1)); [ "$l" = "$n" ] || { echo "line $n reads $l"; exit 1; }; done < /tmp/busy; echo ok $n`)
	var n int
	if _, err := fmt.Sscanf(out, "ok %d", &n); err != nil || n == 0 {
		t.Fatalf("%s: /tmp/busy: %q", what, out)
	}
	if got := mustRun(t, c, "echo alive; uname -r"); !strings.HasPrefix(got, "alive\n") {
		t.Fatalf("%s: %q", what, got)
	}
	return n
}

// TestLiveCaptureOfABusyGuest: a capture copies guest memory while the
// guest runs and pauses it only for what changed since, so a guest that
// writes all the while must come back whole from every capture. Both
// kinds of guest memory are captured three times: a fork's, which QEMU
// maps privately from its artifact and sends in passes (under TCG QEMU
// 7.2 loses some of the writes made during them; nether rewrites the
// fork's own pages in the pause: without that, one restore in three woke
// with a corrupt kernel), and a woken park's, nether's shared memory,
// copied by nether and compared in the pause. Each capture is restored
// and must run commands with the writer's file whole.
func TestLiveCaptureOfABusyGuest(t *testing.T) {
	t.Parallel()
	art := sharedBase(t)
	fork := forkOf(t, art, "snapshot_allow_dirty = 1")
	c := fork.dial()
	mustRun(t, c, busyWriter)
	time.Sleep(500 * time.Millisecond)
	// captureAndCheck captures sb busy and restores the capture.
	captureAndCheck := func(sb *sandbox, c *client.Client, rel, what string) {
		snap := takeSnapshot(t, sb, c, rel)
		r := forkOf(t, snap)
		t.Logf("restore of %s: %d lines whole", what, checkBusyFile(t, r, "restore of "+rel))
		shutdown(t, r, r.dial())
	}
	for i := 1; i <= 3; i++ {
		captureAndCheck(fork, c, fmt.Sprintf("fork%d", i), fmt.Sprintf("a busy fork's capture %d", i))
	}
	body, exit := run(t, c, "__park__ parked")
	if exit != 0 || !strings.HasPrefix(body, "OK parked parked pause_ms=") {
		t.Fatalf("__park__ of a busy fork: %q exit %d", body, exit)
	}
	fork.wait(30 * time.Second)
	woken := forkOf(t, filepath.Join(fork.dir, "parked"), "snapshot_allow_dirty = 1")
	t.Logf("woken park of a busy fork: %d lines whole", checkBusyFile(t, woken, "wake"))
	wc := woken.dial()
	for i := 1; i <= 3; i++ {
		time.Sleep(300 * time.Millisecond)
		captureAndCheck(woken, wc, fmt.Sprintf("woken%d", i), fmt.Sprintf("a busy woken park's capture %d", i))
	}
}
