package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// netLab is a hermetic network for the network tests, made of two
// network namespaces the test creates and removes:
//
//   - box, where the nether under test runs: its loopback (what the guest
//     reaches through 10.0.2.2 when allowed), decoy addresses
//     169.254.169.254 and 192.168.77.1 on a port-less bridge (the host
//     kernel has no dummy interfaces), and one veth to pub. No route
//     leads anywhere else, so even a firewall that lets everything
//     through cannot send a packet off this machine.
//   - pub, behind the veth at 203.0.113.2 (a documentation address the
//     firewall treats as public): the stand-in for the internet.
//
// Names resolve from /etc/netns/<box>/hosts, which `ip netns exec` binds
// over /etc/hosts for nether: public.test, metadata.test, private.test.
// Its resolv.conf points at box's own loopback, where nothing answers.
type netLab struct {
	t        *testing.T
	box, pub string
}

var labSeq atomic.Int32

func newNetLab(t *testing.T) *netLab {
	t.Helper()
	needGuest(t)
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("the network tests need root (network namespaces), and CI must run them")
		}
		t.Skip("SKIPPED (not root): the network tests need network namespaces")
	}
	n := labSeq.Add(1)
	l := &netLab{t: t, box: fmt.Sprintf("nbox%d-%d", os.Getpid(), n), pub: fmt.Sprintf("npub%d-%d", os.Getpid(), n)}
	t.Cleanup(l.remove)
	vb, vp := fmt.Sprintf("vb%d", n), fmt.Sprintf("vp%d", n)
	for _, args := range [][]string{
		{"netns", "add", l.box},
		{"netns", "add", l.pub},
		{"-n", l.box, "link", "set", "lo", "up"},
		{"-n", l.pub, "link", "set", "lo", "up"},
		{"-n", l.box, "link", "add", vb, "type", "veth", "peer", "name", vp, "netns", l.pub},
		{"-n", l.box, "addr", "add", "203.0.113.1/24", "dev", vb},
		{"-n", l.pub, "addr", "add", "203.0.113.2/24", "dev", vp},
		{"-n", l.box, "link", "set", vb, "up"},
		{"-n", l.pub, "link", "set", vp, "up"},
		{"-n", l.box, "link", "add", "decoys", "type", "bridge"},
		{"-n", l.box, "addr", "add", "169.254.169.254/32", "dev", "decoys"},
		{"-n", l.box, "addr", "add", "192.168.77.1/32", "dev", "decoys"},
		{"-n", l.box, "link", "set", "decoys", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	etc := filepath.Join("/etc/netns", l.box)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := "127.0.0.1 localhost\n203.0.113.2 public.test\n169.254.169.254 metadata.test\n192.168.77.1 private.test\n"
	os.WriteFile(filepath.Join(etc, "hosts"), []byte(hosts), 0o644)
	os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o644)
	return l
}

func (l *netLab) remove() {
	for _, ns := range []string{l.box, l.pub} {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			l.t.Errorf("removing network namespace %s: %v %s", ns, err, out)
		}
	}
	os.RemoveAll(filepath.Join("/etc/netns", l.box))
}

// inNS runs f on a thread that has entered namespace ns; sockets f makes
// stay in ns. The thread is thrown away afterwards rather than trusted
// to have switched back.
func inNS(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		fd, err := unix.Open("/var/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- err
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// server is a TCP listener inside a lab namespace that counts the
// connections it accepted and answers each with serve.
type server struct {
	ln       net.Listener
	accepted atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
}

// listen starts a server on addr inside ns.
func (l *netLab) listen(ns, addr string, serve func(net.Conn)) *server {
	l.t.Helper()
	s := &server{}
	err := inNS(ns, func() error {
		ln, err := net.Listen("tcp4", addr)
		s.ln = ln
		return err
	})
	if err != nil {
		l.t.Fatalf("listening on %s in %s: %v", addr, ns, err)
	}
	l.t.Cleanup(func() {
		s.ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	go func() {
		for {
			c, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.accepted.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go serve(c)
		}
	}()
	return s
}

// hello answers with a line naming where it was reached, then closes.
func hello(name string) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		fmt.Fprintf(c, "hello from %s\n", name)
	}
}

// httpHello is a minimal HTTP/1.0 server for busybox wget.
func httpHello(name string, size int) func(net.Conn) {
	return func(c net.Conn) {
		defer c.Close()
		buf := make([]byte, 4096)
		var req bytes.Buffer
		for !bytes.Contains(req.Bytes(), []byte("\r\n\r\n")) {
			n, err := c.Read(buf)
			req.Write(buf[:n])
			if err != nil {
				return
			}
		}
		body := []byte("hello from " + name + "\n")
		if size > 0 {
			body = bytes.Repeat([]byte("x"), size)
		}
		fmt.Fprintf(c, "HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n", len(body))
		c.Write(body)
	}
}

// hold keeps the connection open, reading until the peer goes.
func hold(c net.Conn) { io.Copy(io.Discard, c); c.Close() }
