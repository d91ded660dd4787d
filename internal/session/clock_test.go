package session

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/engine/fake"
)

// TestGuestWallClock: the guest's wall clock is set from the host's at a
// boot (before its first command), at a fork's and a claim's handshake,
// and again after each pause a base capture makes, each time to the
// host's clock when it was sent; an agent that predates OpClock does not
// stop a capture.
func TestGuestWallClock(t *testing.T) {
	eng := fake.New(slog.Default())
	// within checks that the last setting is the host's clock between
	// before and now.
	within := func(t *testing.T, what string, m *fake.Machine, n int, before time.Time) {
		t.Helper()
		clocks := m.Clocks()
		if len(clocks) != n {
			t.Fatalf("%s: the guest's clock was set %d times (%v), want %d", what, len(clocks), clocks, n)
		}
		if got := clocks[n-1]; got.Before(before) || got.After(time.Now()) {
			t.Fatalf("%s: the guest's clock was set to %s, want the host's between %s and now", what, got, before)
		}
	}

	before := time.Now()
	sb := start(t, eng, "", "")
	c := sb.dial()
	mustRun(t, c, "echo up")
	boot := eng.Machines()[0]
	within(t, "a boot", boot, 1, before)

	before = time.Now()
	mustRun(t, c, "__snapshot__ base")
	within(t, "after a base capture's pause", boot, 2, before)

	before = time.Now()
	fork := start(t, eng, "", "restore = 1\nrestore_from = "+sb.dir+"/base\n")
	fc := fork.dial()
	mustRun(t, fc, "echo up")
	fm := eng.Machines()[len(eng.Machines())-1]
	within(t, "a fork's handshake", fm, 1, before)

	before = time.Now()
	mustClaim(t, fc, "user-1", "host-1")
	within(t, "a claim", fm, 2, before)

	// An agent from before OpClock: the capture still succeeds.
	boot.SetFaults(fake.Faults{OldAgent: true})
	if out := mustRun(t, c, "__snapshot__ again"); out == "" {
		t.Fatal("no reply")
	}
	if n := len(boot.Clocks()); n != 2 {
		t.Fatalf("an old agent's clock was set: %d settings", n)
	}
}
