package netstack

import (
	"io"
	"net"
	"testing"
	"time"
)

// TestRate: 1 MiB from a host server to the guest at 2000 kbps takes
// about 4.2 s (within 2x either way) and arrives whole: the cap slows
// the sender, it drops nothing.
func TestRate(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 4 s")
	}
	const size = 1 << 20
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(make([]byte, size))
	}()
	r := newRig(t, Config{RateKbps: 2000})
	c, err := r.g.dial(ctxT(t, 5*time.Second), gw(l.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	k, err := io.Copy(io.Discard, c)
	d := time.Since(start)
	want := time.Duration(float64(size*8) / 2000e3 * float64(time.Second))
	t.Logf("%d bytes at 2000 kbps in %v (ideal %v, %.0f kbps)", k, d, want, float64(k*8)/d.Seconds()/1000)
	if err != nil || k != size {
		t.Fatalf("read %d bytes, %v; want %d", k, err, size)
	}
	if d < want/2 || d > want*2 {
		t.Fatalf("took %v, want about %v", d, want)
	}
}
