package netstack

import (
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// BenchmarkTCP measures TCP throughput through the stack over loopback:
// the guest (a gVisor stack on a socketpair) to a host sink, and a host
// source to the guest. Each op is 64 KiB.
func BenchmarkTCP(b *testing.B) {
	const chunk = 64 << 10
	for _, dir := range []string{"guest->host", "host->guest"} {
		b.Run(dir, func(b *testing.B) {
			l, err := net.Listen("tcp4", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			total := int64(b.N) * chunk
			go func() {
				c, err := l.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				if dir == "guest->host" {
					io.Copy(io.Discard, c)
				} else {
					io.CopyN(c, zeros{}, total)
				}
			}()
			r := newRig(b, Config{})
			c, err := r.g.dial(ctxT(b, 10*time.Second), gw(l.Addr()))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.SetBytes(chunk)
			b.ResetTimer()
			if dir == "guest->host" {
				buf := make([]byte, chunk)
				for i := 0; i < b.N; i++ {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				c.CloseWrite()
				// Done when the host has it all.
				for r.n.Stats().TxBytes < uint64(total) {
					time.Sleep(time.Millisecond)
				}
			} else if k, err := io.CopyN(io.Discard, c, total); err != nil {
				b.Fatalf("read %d of %d: %v", k, total, err)
			}
		})
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// TestIdleMemory reports what an idle Stack costs: the heap before and
// after New (with a GC each side), and the goroutines it starts.
func TestIdleMemory(t *testing.T) {
	host, ge := socketpair(t)
	defer ge.Close()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()
	n, err := New(Config{Policy: allowAll, Log: discard()}, host)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("idle stack: %d KiB of heap, %d goroutines",
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))/1024, runtime.NumGoroutine()-g0)
}
