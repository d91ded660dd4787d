package control

import (
	"testing"
	"time"
)

// TestIdleFor: the server is idle only with no client connected and no
// command running; a command that outlives its client holds it awake
// until the command ends.
func TestIdleFor(t *testing.T) {
	fb := newFake()
	fb.up()
	fb.block = true
	deaf := make(chan struct{})
	fb.deaf = deaf // Put ignores its context until deaf closes
	h := start(t, fb, 0, nil)
	idle := func() time.Duration { return h.s.IdleFor(time.Now()) }

	waitFor(t, "the server to be idle", 5*time.Second, func() bool { return idle() > 20*time.Millisecond })
	c := h.dial(t)
	waitFor(t, "the client to be seated", 5*time.Second, func() bool { return h.clientCount() == 1 })
	if d := idle(); d != 0 {
		t.Fatalf("idle for %s with a client connected", d)
	}
	c.send("__put__ a b")
	waitFor(t, "Put to start", 5*time.Second, func() bool { return fb.putCalls.Load() == 1 })
	c.c.Close()
	waitFor(t, "the client to leave", 5*time.Second, func() bool { return h.clientCount() == 0 })
	time.Sleep(50 * time.Millisecond)
	if d := idle(); d != 0 {
		t.Fatalf("idle for %s while a transfer still runs", d)
	}
	close(deaf)
	waitFor(t, "the server to be idle again", 5*time.Second, func() bool { return idle() > 0 })
	if d := idle(); d > time.Second {
		t.Fatalf("idle for %s: the clock did not restart when the work ended", d)
	}
}
