package e2e

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

// guestOffset is the guest's wall clock less the host's, read with date at
// the midpoint of the command's round trip (itself logged: the error is
// at most half of it).
func guestOffset(t *testing.T, c *client.Client) time.Duration {
	t.Helper()
	h0 := time.Now()
	out := mustRun(t, c, "date +%s.%N")
	h1 := time.Now()
	g, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	if err != nil {
		t.Fatalf("date printed %q", out)
	}
	mid := h0.Add(h1.Sub(h0) / 2)
	guest := time.Unix(0, int64(g*1e9))
	t.Logf("guest - host = %s (round trip %s)", guest.Sub(mid).Round(time.Millisecond), h1.Sub(h0).Round(time.Millisecond))
	return guest.Sub(mid)
}

// wantClock fails unless the guest's wall clock is within a second of the
// host's at the first command after what.
func wantClock(t *testing.T, c *client.Client, what string) {
	t.Helper()
	if off := guestOffset(t, c); off < -time.Second || off > time.Second {
		t.Errorf("%s: the guest's wall clock is %s off the host's at the first command, want within 1 s", what, off.Round(time.Millisecond))
	}
}

// TestWallClockAfterRestore: the outside run's measurements, each after
// the capture has aged: a fork of a base captured long before (20.2 s
// behind on the landed build), a wake of a park that lay for seconds (35.5
// s behind), a claim of a member restored seconds earlier (38.7 s behind),
// and the parent that kept running after its capture's pause. Each is
// within a second at its first command.
func TestWallClockAfterRestore(t *testing.T) {
	const age = 6 * time.Second
	base := sharedBase(t)
	if st, err := os.Stat(filepath.Join(base, "COMMITTED")); err == nil {
		time.Sleep(time.Until(st.ModTime().Add(age)))
	}

	fork := forkOf(t, base)
	fc := fork.dial()
	wantClock(t, fc, "a fork of a base captured over 6 s before")

	// Park it and restore a pool member, let both lie for one age
	// together (one sleep, not two), then wake the park and claim the
	// member: each has aged at least age.
	if body, exit := run(t, fc, "__park__ p"); exit != 0 {
		t.Fatalf("__park__: %q exit %d", body, exit)
	}
	fork.wait(30 * time.Second)
	member := forkOf(t, base)
	mc := member.dial()
	mustRun(t, mc, "true")
	time.Sleep(age)
	wake := forkOf(t, filepath.Join(fork.dir, "p"))
	wc := wake.dial()
	wantClock(t, wc, "a wake 6 s after its park")
	shutdown(t, wake, wc)

	if body, exit := run(t, mc, "__claim__ clock-user clock-host"); exit != 0 {
		t.Fatalf("__claim__: %q exit %d", body, exit)
	}
	wantClock(t, mc, "a claim over 6 s after the member's restore")

	// The parent of a snapshot runs on past its capture's pause.
	for range 3 {
		takeSnapshot(t, member, mc, "s")
		os.RemoveAll(filepath.Join(member.dir, "s"))
	}
	wantClock(t, mc, "a sandbox that ran on through three captures")
	shutdown(t, member, mc)
}
