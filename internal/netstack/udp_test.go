package netstack

import (
	"net"
	"net/netip"
	"testing"
	"time"
)

// udpEcho is a loopback UDP server that echoes each datagram.
func udpEcho(t testing.TB) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	go func() {
		buf := make([]byte, 65536)
		for {
			k, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			c.WriteToUDP(buf[:k], from)
		}
	}()
	return c
}

func TestUDP(t *testing.T) {
	srv := udpEcho(t)
	for _, tc := range []struct {
		name  string
		allow bool
	}{
		{"allowed", true},
		{"blocked", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, Config{Policy: func(Proto, netip.AddrPort) Verdict { return Verdict{Allow: tc.allow} }})
			c := r.g.dialUDP(t, gw(srv.LocalAddr()))
			buf := make([]byte, 100)
			got := 0
			for i := 0; i < 3; i++ {
				c.Write([]byte("ping"))
				c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				if k, err := c.Read(buf); err == nil && string(buf[:k]) == "ping" {
					got++
				}
			}
			if tc.allow {
				if got != 3 {
					t.Fatalf("%d echoes, want 3", got)
				}
				// The counters move just after the bytes do.
				waitFor(t, func() bool {
					s := r.n.Stats()
					return s.TxBytes == 12 && s.RxBytes == 12 && s.Flows == 1
				})
			}
			s := r.n.Stats()
			if !tc.allow && (got != 0 || s.Blocked != 3) {
				t.Fatalf("%d echoes, stats %+v; want none, 3 blocked", got, s)
			}
		})
	}
}
