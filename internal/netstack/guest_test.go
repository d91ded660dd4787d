package netstack

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// guest plays the sandbox's guest: a second gVisor stack at 10.0.2.15
// with the NIC's MAC, on the other end of a frame socketpair, as the
// engine's virtio-net would be.
type guest struct {
	s  *stack.Stack
	ch *channel.Endpoint

	mu    sync.Mutex
	link  *os.File          // the guest's end now
	sniff func([]byte) bool // sees frames from the stack first; true = consumed
	wg    sync.WaitGroup
	ctx   context.Context
	stop  context.CancelFunc
}

// socketpair makes a frame channel: one datagram per frame.
func socketpair(t testing.TB) (host, guestEnd *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		// Room for a burst of frames, as QEMU's queue would give.
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4<<20)
	}
	unix.SetNonblock(fds[1], true)
	return os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "guest")
}

func newGuest(t testing.TB, link *os.File) *guest {
	t.Helper()
	return newGuestMAC(t, link, guestMAC)
}

// newGuestMAC is a guest whose NIC has the address mac.
func newGuestMAC(t testing.TB, link *os.File, mac tcpip.LinkAddress) *guest {
	t.Helper()
	g := &guest{s: stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})}
	sack := tcpip.TCPSACKEnabled(true)
	g.s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	g.ch = channel.New(1024, mtu, mac)
	if err := g.s.CreateNIC(1, ethernet.New(g.ch)); err != nil {
		t.Fatal(err)
	}
	g.s.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: guestIP, PrefixLen: 24}}, stack.AddressProperties{})
	subnet, _ := tcpip.NewSubnet(tcpip.AddrFrom4([4]byte{10, 0, 2, 0}), tcpip.MaskFromBytes([]byte{255, 255, 255, 0}))
	g.s.SetRouteTable([]tcpip.Route{
		{Destination: subnet, NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(GatewayAddr.As4()), NIC: 1},
	})
	g.ctx, g.stop = context.WithCancel(context.Background())
	g.wg.Add(1)
	go g.out()
	g.attach(link)
	t.Cleanup(g.close)
	return g
}

// attach moves the guest onto another link (a restored session's),
// leaving the old one deaf and mute.
func (g *guest) attach(link *os.File) {
	g.mu.Lock()
	g.link = link
	g.mu.Unlock()
	g.wg.Add(1)
	go g.in(link)
}

func (g *guest) current() *os.File {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.link
}

func (g *guest) in(link *os.File) {
	defer g.wg.Done()
	buf := make([]byte, 65536)
	for {
		link.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		k, err := link.Read(buf)
		if g.ctx.Err() != nil {
			return
		}
		if err != nil {
			if os.IsTimeout(err) {
				continue
			}
			return
		}
		if g.current() != link {
			continue
		}
		f := append([]byte(nil), buf[:k]...)
		g.mu.Lock()
		sniff := g.sniff
		g.mu.Unlock()
		if sniff != nil && sniff(f) {
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(f)})
		g.ch.InjectInbound(0, pkt)
		pkt.DecRef()
	}
}

func (g *guest) out() {
	defer g.wg.Done()
	for {
		pkt := g.ch.ReadContext(g.ctx)
		if pkt == nil {
			return
		}
		var b []byte
		for _, s := range pkt.AsSlices() {
			b = append(b, s...)
		}
		pkt.DecRef()
		g.write(b)
	}
}

// write sends a raw frame as the guest's NIC would.
func (g *guest) write(f []byte) {
	if l := g.current(); l != nil {
		l.Write(f)
	}
}

func (g *guest) setSniff(f func([]byte) bool) {
	g.mu.Lock()
	g.sniff = f
	g.mu.Unlock()
}

func (g *guest) close() {
	g.stop()
	g.ch.Close()
	g.wg.Wait()
	g.s.Close()
	g.s.Wait()
	if l := g.current(); l != nil {
		l.Close()
	}
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}
}

// dial connects from the guest.
func (g *guest) dial(ctx context.Context, dst netip.AddrPort) (*gonet.TCPConn, error) {
	return gonet.DialContextTCP(ctx, g.s, fullAddr(dst), ipv4.ProtocolNumber)
}

// dialEndpoint connects from the guest and also returns the connection's
// endpoint, which a test can Abort (send a reset).
func (g *guest) dialEndpoint(t testing.TB, dst netip.AddrPort) (*gonet.TCPConn, tcpip.Endpoint) {
	t.Helper()
	var wq waiter.Queue
	ep, terr := g.s.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		t.Fatal(terr)
	}
	we, ch := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&we)
	defer wq.EventUnregister(&we)
	switch err := ep.Connect(fullAddr(dst)); err.(type) {
	case nil:
	case *tcpip.ErrConnectStarted:
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("the guest's connect did not finish in 5 s")
		}
		if err := ep.LastError(); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatal(err)
	}
	c := gonet.NewTCPConn(&wq, ep)
	t.Cleanup(func() { c.Close() })
	return c, ep
}

func (g *guest) dialUDP(t testing.TB, dst netip.AddrPort) *gonet.UDPConn {
	t.Helper()
	ra := fullAddr(dst)
	c, err := gonet.DialUDP(g.s, nil, &ra, ipv4.ProtocolNumber)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// rig is a Stack and its guest.
type rig struct {
	n *Stack
	g *guest
}

func allowAll(Proto, netip.AddrPort) Verdict { return Verdict{Allow: true} }

func newRig(t testing.TB, cfg Config) rig {
	t.Helper()
	host, ge := socketpair(t)
	if cfg.Policy == nil {
		cfg.Policy = allowAll
	}
	if cfg.Log == nil {
		cfg.Log = discard()
	}
	n, err := New(cfg, host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return rig{n: n, g: newGuest(t, ge)}
}

// gw is 10.0.2.2 at a loopback listener's port.
func gw(a net.Addr) netip.AddrPort {
	return netip.AddrPortFrom(GatewayAddr, uint16(netip.MustParseAddrPort(a.String()).Port()))
}

// echoServer is a loopback TCP server that echoes each connection.
func echoServer(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return l
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
