package netstack

import (
	"io"
	"strings"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip/header"
	"time"
)

// TestResetGuestConns: a guest blocked in a read on a connection a
// capture carried sees a reset once the restored stack resets it, both
// with the recorded sequence numbers and, through the challenge ACK,
// without them.
func TestResetGuestConns(t *testing.T) {
	l := echoServer(t)
	for _, tc := range []struct {
		name    string
		numbers bool
		rstOnly bool // only the RST at RcvNxt: proves the numbers exact
	}{
		{"the recorded numbers alone", true, true},
		{"recorded numbers", true, false},
		{"numbers lost", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{})
			c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write([]byte("hello"))
			io.ReadFull(c, make([]byte, 5))
			time.Sleep(50 * time.Millisecond) // the guest's ACK of the echo
			cs := r.n.GuestConns()
			if len(cs) != 1 {
				t.Fatalf("conns %+v, want one", cs)
			}
			gc := cs[0]
			if gc.Local.Addr() != GuestAddr || gc.Remote != gw(l.Addr()) || gc.SndNxt == 0 || gc.RcvNxt == 0 {
				t.Fatalf("conn %+v", gc)
			}
			if !tc.numbers {
				gc.SndNxt, gc.RcvNxt = 12345, 67890
			}
			// The capture: the guest moves to a new stack (a restored
			// session's); the old one is gone with its host sockets.
			host, ge := socketpair(t)
			n2, err := New(Config{Policy: allowAll, Log: discard()}, host)
			if err != nil {
				t.Fatal(err)
			}
			defer n2.Close()
			r.g.attach(ge)

			read := make(chan error, 1)
			go func() {
				_, err := c.Read(make([]byte, 10))
				read <- err
			}()
			time.Sleep(20 * time.Millisecond) // blocked in recv()
			if tc.rstOnly {
				n2.io.Write(segmentFrame(gc, gc.RcvNxt, gc.SndNxt, header.TCPFlagRst|header.TCPFlagAck))
			} else {
				n2.ResetGuestConns([]GuestConn{gc})
			}
			select {
			case err := <-read:
				if err == nil || !strings.Contains(err.Error(), "reset") {
					t.Fatalf("read: %v, want a reset", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("the guest's read hangs")
			}
			// The guest's next connection works.
			c2, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
			if err != nil {
				t.Fatalf("a new connection after the reset: %v", err)
			}
			c2.Close()
		})
	}
}
