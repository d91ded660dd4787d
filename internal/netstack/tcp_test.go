package netstack

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

func TestTCP(t *testing.T) {
	l := echoServer(t)
	for _, tc := range []struct {
		name    string
		allow   bool
		dst     netip.AddrPort
		wantErr bool
	}{
		{"allowed through the gateway", true, gw(l.Addr()), false},
		{"blocked", false, gw(l.Addr()), true},
		{"allowed, nothing listening", true, netip.AddrPortFrom(GatewayAddr, 1), true},
		{"resolver address, not port 53", true, netip.AddrPortFrom(DNSAddr, 80), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var flows []Flow
			r := newRig(t, Config{
				Policy: func(p Proto, dst netip.AddrPort) Verdict { return Verdict{Allow: tc.allow, Rule: "test rule"} },
				OnFlow: func(f Flow) { mu.Lock(); flows = append(flows, f); mu.Unlock() },
			})
			start := time.Now()
			c, err := r.g.dial(ctxT(t, 5*time.Second), tc.dst)
			if tc.wantErr {
				if err == nil {
					c.Close()
					t.Fatal("connected, want a refusal")
				}
				// A reset, not a timeout: well under a second.
				if d := time.Since(start); d > time.Second {
					t.Fatalf("refusal took %v", d)
				}
				if tc.name == "blocked" {
					if s := r.n.Stats(); s.Blocked != 1 {
						t.Fatalf("stats %+v, want one blocked", s)
					}
					mu.Lock()
					defer mu.Unlock()
					if len(flows) != 1 || flows[0].Allowed || flows[0].Dst != tc.dst || flows[0].Proto != TCP || flows[0].Rule != "test rule" {
						t.Fatalf("flows %+v", flows)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			msg := bytes.Repeat([]byte("nether"), 10000)
			go c.Write(msg)
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("echo: %v", err)
			}
			c.Close()
			waitFor(t, func() bool {
				s := r.n.Stats()
				return s.TxBytes == uint64(len(msg)) && s.RxBytes == uint64(len(msg)) && s.Flows == 0
			})
		})
	}
}

// TestTCPHalfClose: the guest's shutdown(SHUT_WR) reaches the host peer
// as end of stream, and the host's answer after it still arrives.
func TestTCPHalfClose(t *testing.T) {
	l := echoServer(t)
	r := newRig(t, Config{})
	c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("bye"))
	c.CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "bye" {
		t.Fatalf("read %q, %v", got, err)
	}
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var errTimeout = errors.New("timeout")

// TestTCPResetPassesThrough: a reset on one side of a flow reaches the
// other side as a reset, not as an orderly end of stream that would pass
// a cut-short transfer for a whole one.
func TestTCPResetPassesThrough(t *testing.T) {
	// resetter accepts connections and hands them to the test.
	resetter := func(t *testing.T) (net.Listener, chan *net.TCPConn) {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		accepted := make(chan *net.TCPConn, 1)
		go func() {
			if c, err := l.Accept(); err == nil {
				accepted <- c.(*net.TCPConn)
			}
		}()
		return l, accepted
	}
	t.Run("host resets, the guest sees a reset", func(t *testing.T) {
		l, accepted := resetter(t)
		r := newRig(t, Config{})
		c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hc := <-accepted
		hc.SetLinger(0)
		hc.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c)
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) || !strings.Contains(err.Error(), "reset") {
			t.Fatalf("the guest read %v, want a connection reset", err)
		}
	})
	t.Run("guest resets, the host sees a reset", func(t *testing.T) {
		l, accepted := resetter(t)
		r := newRig(t, Config{})
		c, ep := r.g.dialEndpoint(t, gw(l.Addr()))
		hc := <-accepted
		defer hc.Close()
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := io.ReadFull(hc, b); err != nil {
			t.Fatal(err)
		}
		ep.Abort()
		hc.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(hc)
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("the host read %v, want ECONNRESET", err)
		}
	})
}

// TestNewGuestMAC: after SetGuestMAC (a fork's own address) a guest with
// the new MAC reaches the host at once, and the stack sends to it; a
// frame from a third MAC is dropped as spoofed.
func TestNewGuestMAC(t *testing.T) {
	l := echoServer(t)
	host, ge := socketpair(t)
	n, err := New(Config{Policy: allowAll, Log: discard()}, host)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	mac := net.HardwareAddr{0x02, 0x6e, 0x65, 0x74, 0x68, 0x72}
	if err := n.SetGuestMAC(mac); err != nil {
		t.Fatal(err)
	}
	if err := n.SetGuestMAC(net.HardwareAddr{0x01, 0, 0, 0, 0, 1}); err == nil {
		t.Fatal("a multicast address was taken as the guest's")
	}
	g := newGuestMAC(t, ge, tcpip.LinkAddress(mac))
	c, err := g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
	if err != nil {
		t.Fatalf("the guest with its new MAC: %v", err)
	}
	defer c.Close()
	c.Write([]byte("hi"))
	b := make([]byte, 2)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "hi" {
		t.Fatalf("echo: %q %v", b, err)
	}
	spoof := make([]byte, 60)
	copy(spoof[0:6], "\x52\x55\x0a\x00\x02\x02")
	copy(spoof[6:12], "\x02\x00\x00\x00\x00\x09")
	spoof[12], spoof[13] = 0x08, 0x06 // ARP
	before := n.Stats().Dropped
	g.write(spoof)
	waitFor(t, func() bool { return n.Stats().Dropped > before })
}
