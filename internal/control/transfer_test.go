package control

import (
	"testing"
	"time"
)

// A transfer's context ends when its client goes away: nobody waits for
// it. A shell command's does not: the command runs on in the guest and
// its output is drained (spec: disconnect is safe).
func TestWorkWhenTheClientLeaves(t *testing.T) {
	for _, tc := range []struct{ line, method string }{
		{"__put__ a b", "Put"},
		{"__get__ a b", "Get"},
	} {
		t.Run(tc.method+" is cancelled", func(t *testing.T) {
			fb := newFake()
			fb.up()
			fb.block = true
			h := start(t, fb, 0, nil)
			c := h.dial(t)
			c.send(tc.line)
			waitFor(t, tc.method+" to start", 5*time.Second, func() bool { return len(fb.contexts(tc.method)) == 1 })
			ctx := fb.contexts(tc.method)[0]
			if ctx.Err() != nil {
				t.Fatalf("%s's context ended before the client left", tc.method)
			}
			c.c.Close()
			select {
			case <-ctx.Done():
			case <-time.After(5 * time.Second):
				t.Fatalf("%s went on after its client left", tc.method)
			}
			waitFor(t, "the slot to be released", 5*time.Second, h.primaryFree)
			b := h.dial(t)
			if got := b.roundTrip("echo next"); got != framed("ran echo next\n", "0") {
				t.Fatalf("the next primary: %q", got)
			}
		})
	}

	t.Run("a shell command runs on", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, nil)
		gate := make(chan struct{})
		fb.on("long", script{chunks: [][]byte{[]byte("start\n"), []byte("rest\n")}, gate: gate, gateAt: 1, status: "0"})
		c := h.dial(t)
		c.send("long")
		c.readUntil("start\n", 5*time.Second)
		c.c.Close()
		waitFor(t, "the client to be dropped", 5*time.Second, func() bool { return h.clientCount() == 0 })
		time.Sleep(50 * time.Millisecond)
		if err := fb.contexts("Exec")[0].Err(); err != nil {
			t.Fatalf("the command was cancelled when its client left: %v", err)
		}
		close(gate)
		waitDrained(t, fb.output(t, "long", 0), 5*time.Second)
	})
}
