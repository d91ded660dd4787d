package netstack

import (
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

func runtimeGoroutines() int { return runtime.NumGoroutine() }

// openFDs counts the process's open sockets: every descriptor a stack
// holds is one (the link, host sockets), while the runtime keeps other
// kinds in caches of its own (pipes for splice).
func openFDs(t testing.TB) int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	k := 0
	for _, e := range es {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); strings.HasPrefix(l, "socket:") {
			k++
		}
	}
	return k
}

// TestClose: with flows open and a guest that stopped reading, Close
// returns, closes every host socket and the link, and leaves no
// goroutine of the stack's behind.
func TestClose(t *testing.T) {
	l := echoServer(t)
	srv := udpEcho(t)
	// A first round starts what the process keeps for good (gVisor's
	// and the runtime's lazily started parts): not the stack's.
	closeRound(t, l, srv)
	time.Sleep(50 * time.Millisecond) // the servers' goroutines settle
	goroutines, fds := runtimeGoroutines(), openFDs(t)
	closeRound(t, l, srv)
	deadline := time.Now().Add(5 * time.Second)
	for runtimeGoroutines() > goroutines+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, %d before:\n%s", runtimeGoroutines(), goroutines, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	for openFDs(t) > fds {
		if time.Now().After(deadline) {
			t.Fatalf("%d descriptors open, %d before: %s", openFDs(t), fds, fdList())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func closeRound(t *testing.T, l net.Listener, srv *net.UDPConn) {
	host, ge := socketpair(t)
	n, err := New(Config{Policy: allowAll, Log: discard()}, host)
	if err != nil {
		t.Fatal(err)
	}
	g := newGuest(t, ge)
	defer g.close()
	c, err := g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("hello"))
	io.ReadFull(c, make([]byte, 5))
	u := g.dialUDP(t, gw(srv.LocalAddr()))
	defer u.Close()
	u.Write([]byte("x"))
	u.Read(make([]byte, 1))
	if s := n.Stats(); s.Flows != 2 {
		t.Fatalf("flows %d, want 2", s.Flows)
	}
	// A guest that stops reading: Close must not wait on it.
	g.setSniff(func([]byte) bool { return true })
	done := make(chan error)
	go func() { done <- n.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close hangs")
	}
	if _, err := host.Write([]byte{0}); err == nil {
		t.Fatal("the link is still open")
	}
}

func fdList() string {
	es, _ := os.ReadDir("/proc/self/fd")
	var s string
	for _, e := range es {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		s += e.Name() + "=" + l + " "
	}
	return s
}
