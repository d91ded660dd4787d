package control

import (
	"fmt"
	"testing"
)

// The seat rule: a client that connects after the primary hung up is the
// primary, however far the server has got reading what the old primary
// sent. Repeated, because the window it closes is a race.
func TestSeatPassesOnHangUp(t *testing.T) {
	fb := newFake()
	fb.up()
	h := start(t, fb, 0, nil)
	lines := []string{"", "__info__", "echo gone", "__help__\n__info__"}
	for i := range 300 {
		// The leaving primary: connect, maybe send a line (still unread,
		// perhaps), close.
		a := h.dial(t)
		if line := lines[i%len(lines)]; line != "" {
			a.send(line)
		}
		a.c.Close()
		// The next client connects at once and drives.
		b := h.dial(t)
		want := fmt.Sprintf("echo b%d", i)
		got := b.roundTrip(want)
		if got != framed("ran "+want+"\n", "0") {
			t.Fatalf("round %d (the old primary sent %q): the client after it got %q", i, lines[i%len(lines)], got)
		}
		b.c.Close()
	}
}
