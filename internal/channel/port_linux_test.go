package channel

import (
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// rawPTY opens a pseudo-terminal pair in raw mode: two character devices
// joined back to back, which the Mux reads with readv as it
// does the guest's virtio-serial port. Both are non-blocking, so the
// Mux's I/O waits in the runtime's poller, as on the port.
func rawPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	open := func(path string) int {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_NOCTTY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Skipf("no pseudo-terminals here: %v", err)
		}
		return fd
	}
	m := open("/dev/ptmx")
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(m, unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s := open("/dev/pts/" + strconv.Itoa(n))
	for _, fd := range []int{m, s} {
		tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
		if err != nil {
			t.Fatal(err)
		}
		// What cfmakeraw(3) does.
		tio.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON | unix.IXOFF
		tio.Oflag &^= unix.OPOST
		tio.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
		tio.Cflag &^= unix.CSIZE | unix.PARENB
		tio.Cflag |= unix.CS8
		tio.Cc[unix.VMIN], tio.Cc[unix.VTIME] = 1, 0
		if err := unix.IoctlSetTermios(fd, unix.TCSETS, tio); err != nil {
			t.Fatal(err)
		}
	}
	master, slave = os.NewFile(uintptr(m), "ptmx"), os.NewFile(uintptr(s), "pts")
	t.Cleanup(func() { master.Close(); slave.Close() })
	return master, slave
}

// TestPortReaderCarriesStreams runs a host and a guest Mux over a raw
// pseudo-terminal pair, which newPortReader takes for ports: several
// windows of bytes go each way intact through vectored reads (a
// terminal, like the port, hands over less than asked).
func TestPortReaderCarriesStreams(t *testing.T) {
	master, slave := rawPTY(t)
	if newPortReader(master) == nil || newPortReader(slave) == nil {
		t.Fatal("a character device was not taken for a port")
	}
	host, guest := New(Host, quietLog()), New(Guest, quietLog())
	defer host.Close()
	defer guest.Close()
	host.Attach(master, false)
	guest.Attach(slave, false)
	up := make([]byte, 3*Window+5)
	down := make([]byte, 2*Window+7)
	rand.Read(up)
	rand.Read(down)
	s, err := host.Open([]byte("echo"))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		s.Write(up)
		s.CloseWrite(nil)
	}()
	g := accept(t, guest)
	go func() {
		g.Write(down)
		g.CloseWrite(nil)
	}()
	gotUp, err := io.ReadAll(g)
	if err != nil || !bytes.Equal(gotUp, up) {
		t.Fatalf("host to guest: %d of %d bytes, %v", len(gotUp), len(up), err)
	}
	gotDown, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(gotDown, down) {
		t.Fatalf("guest to host: %d of %d bytes, %v", len(gotDown), len(down), err)
	}
}
