package channel

import (
	"io"
	"net"
	"os"
	"syscall"
	"testing"
)

// socketPair is a connected pair of Unix stream sockets, the transport
// nether has to QEMU.
func socketPair(b testing.TB) (net.Conn, net.Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err != nil {
		b.Fatal(err)
	}
	conn := func(fd int) net.Conn {
		f := os.NewFile(uintptr(fd), "socket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	return conn(fds[0]), conn(fds[1])
}

// BenchmarkStreamThroughput moves bytes one way through a host and a guest
// Mux over a socket pair, 32 KiB writes, as a put does.
func BenchmarkStreamThroughput(b *testing.B) {
	host, guest := New(Host, quietLog()), New(Guest, quietLog())
	hc, gc := socketPair(b)
	host.Attach(hc, false)
	guest.Attach(gc, false)
	defer func() { host.Close(); guest.Close(); hc.Close(); gc.Close() }()
	s, err := host.Open(nil)
	if err != nil {
		b.Fatal(err)
	}
	g := accept(b, guest)
	const chunk = 32 << 10
	buf := make([]byte, chunk)
	b.SetBytes(chunk)
	b.ResetTimer()
	done := make(chan int64)
	go func() {
		n, _ := io.CopyBuffer(io.Discard, struct{ io.Reader }{g}, make([]byte, chunk))
		done <- n
	}()
	for i := 0; i < b.N; i++ {
		if _, err := s.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	s.CloseWrite(nil)
	if n := <-done; n != int64(b.N)*chunk {
		b.Fatalf("read %d bytes, want %d", n, int64(b.N)*chunk)
	}
}
