// Package netstack is a sandbox's user-mode network: the guest's NIC
// frames end in gVisor's TCP/IP stack (gvisor.dev/gvisor/pkg/tcpip),
// which terminates the guest's TCP and UDP; what the firewall allows is
// carried on host sockets nether opens (NAT). No tap, bridge or privilege
// on the host. The guest is 10.0.2.15/24; the stack is its gateway
// 10.0.2.2 (which means the host's loopback) and its resolver 10.0.2.3.
package netstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/link/channel"
	"gvisor.dev/gvisor/pkg/tcpip/link/ethernet"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// The guest's network.
var (
	GuestAddr   = netip.MustParseAddr("10.0.2.15")
	GatewayAddr = netip.MustParseAddr("10.0.2.2")
	DNSAddr     = netip.MustParseAddr("10.0.2.3")
	hostLoop    = netip.MustParseAddr("127.0.0.1")
	stackMAC    = tcpip.LinkAddress("\x52\x55\x0a\x00\x02\x02")
)

// Proto names a flow's transport.
type Proto string

// The transports.
const (
	TCP Proto = "TCP"
	UDP Proto = "UDP"
)

// Policy decides a new flow by the address the guest connects to.
type Policy func(proto Proto, dst netip.AddrPort) bool

// Flow is one new flow attempt, allowed or not. Reason says why a flow
// the policy allowed was refused anyway ("flow limit"), or is "".
type Flow struct {
	Proto   Proto
	Dst     netip.AddrPort
	Allowed bool
	Reason  string
}

// Config is a stack's configuration.
type Config struct {
	Policy      Policy     // required
	OnFlow      func(Flow) // every new flow attempt; may be nil
	RateKbps    int64      // host -> guest cap; 0 = unlimited
	MaxFlows    int        // concurrent flows (default 1024)
	MaxHalfOpen int        // TCP connects in progress (default 128)
	Resolver    *net.Resolver
	DialTimeout time.Duration
	Log         *slog.Logger
}

// Stats are a stack's counters.
type Stats struct {
	TxBytes, RxBytes uint64 // payload the guest sent out, and received
	Blocked          uint64 // flows the policy refused
	Refused          uint64 // flows a cap refused
	Dropped          uint64 // frames dropped: malformed, spoofed, DNS over its bound
	Flows            int    // open now
}

// Stack is one sandbox's network.
type Stack struct {
	cfg   Config
	log   *slog.Logger
	link  *os.File
	ch    *channel.Endpoint
	s     *stack.Stack
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup
	rate  *bucket
	flows atomic.Int64
	dns   chan struct{} // DNS queries in flight

	tx, rx, blocked, refused, dropped atomic.Uint64

	mu     sync.Mutex
	closed bool
	conns  map[*flowConn]struct{}
}

const nicID = 1

// New starts a stack on link, the host end of the NIC's frame channel
// (one Ethernet frame per message).
func New(cfg Config, link *os.File) (*Stack, error) {
	if cfg.Policy == nil {
		return nil, errors.New("netstack: no policy")
	}
	if cfg.MaxFlows <= 0 {
		cfg.MaxFlows = 1024
	}
	if cfg.MaxHalfOpen <= 0 {
		cfg.MaxHalfOpen = 128
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 10 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Stack{cfg: cfg, log: cfg.Log, link: link, ctx: ctx, stop: cancel,
		dns: make(chan struct{}, 64), conns: map[*flowConn]struct{}{}}
	if cfg.RateKbps > 0 {
		n.rate = newBucket(cfg.RateKbps * 1000 / 8)
	}
	n.s = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
		HandleLocal:        false,
	})
	n.ch = channel.New(512, 1500, stackMAC)
	if err := n.s.CreateNIC(nicID, ethernet.New(n.ch)); err != nil {
		return nil, fmt.Errorf("netstack: creating the NIC: %v", err)
	}
	// Promiscuous and spoofing: the stack answers for every address the
	// guest sends to (it is the guest's whole world), so each
	// destination's connection lands in the forwarders.
	n.s.SetPromiscuousMode(nicID, true)
	n.s.SetSpoofing(nicID, true)
	for _, a := range []netip.Addr{GatewayAddr, DNSAddr} {
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
			AddressWithPrefix: tcpip.AddrFrom4(a.As4()).WithPrefix()}
		if err := n.s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return nil, fmt.Errorf("netstack: adding %s: %v", a, err)
		}
	}
	n.s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	tf := tcp.NewForwarder(n.s, 0, cfg.MaxHalfOpen, n.tcpFlow)
	n.s.SetTransportProtocolHandler(tcp.ProtocolNumber, tf.HandlePacket)
	uf := udp.NewForwarder(n.s, n.udpFlow)
	n.s.SetTransportProtocolHandler(udp.ProtocolNumber, uf.HandlePacket)

	n.wg.Add(2)
	go n.inbound()
	go n.outbound()
	return n, nil
}

// inbound moves the guest's frames into the stack. Only frames from the
// guest's own address get in: a spoofed source is dropped.
func (n *Stack) inbound() {
	defer n.wg.Done()
	buf := make([]byte, 65536)
	for {
		k, err := n.link.Read(buf)
		if err != nil {
			return
		}
		frame := buf[:k]
		if !fromGuest(frame) {
			n.dropped.Add(1)
			continue
		}
		pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(append([]byte(nil), frame...))})
		n.ch.InjectInbound(0, pkt)
		pkt.DecRef()
	}
}

// fromGuest accepts ARP and IPv4 frames whose IPv4 source is the guest's.
func fromGuest(f []byte) bool {
	if len(f) < header.EthernetMinimumSize {
		return false
	}
	eth := header.Ethernet(f)
	switch eth.Type() {
	case header.ARPProtocolNumber:
		return true
	case header.IPv4ProtocolNumber:
		ip := header.IPv4(f[header.EthernetMinimumSize:])
		if !ip.IsValid(len(ip)) {
			return false
		}
		return ip.SourceAddress() == tcpip.AddrFrom4(GuestAddr.As4())
	}
	return false
}

// outbound writes the stack's frames to the guest.
func (n *Stack) outbound() {
	defer n.wg.Done()
	for {
		pkt := n.ch.ReadContext(n.ctx)
		if pkt == nil {
			return
		}
		var b []byte
		for _, s := range pkt.AsSlices() {
			b = append(b, s...)
		}
		pkt.DecRef()
		if _, err := n.link.Write(b); err != nil && n.ctx.Err() != nil {
			return
		}
	}
}

// Stats reads the counters.
func (n *Stack) Stats() Stats {
	return Stats{TxBytes: n.tx.Load(), RxBytes: n.rx.Load(), Blocked: n.blocked.Load(),
		Refused: n.refused.Load(), Dropped: n.dropped.Load(), Flows: int(n.flows.Load())}
}

// Close ends every flow and the stack. The link stays open: it is the
// engine's.
func (n *Stack) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	conns := n.conns
	n.conns = nil
	n.mu.Unlock()
	n.stop()
	for c := range conns {
		c.close()
	}
	n.link.SetReadDeadline(time.Now())
	n.ch.Close()
	n.s.Close()
	n.wg.Wait()
	n.s.Wait()
	return nil
}

// decide applies the policy and the flow cap to a new flow, reports it,
// and says whether it may go on. A flow it admits holds a slot until
// release.
func (n *Stack) decide(proto Proto, dst netip.AddrPort) bool {
	f := Flow{Proto: proto, Dst: dst, Allowed: n.cfg.Policy(proto, dst)}
	if !f.Allowed {
		n.blocked.Add(1)
	} else if n.flows.Add(1) > int64(n.cfg.MaxFlows) {
		n.flows.Add(-1)
		n.refused.Add(1)
		f.Allowed, f.Reason = false, "flow limit"
	}
	if n.cfg.OnFlow != nil {
		n.cfg.OnFlow(f)
	}
	return f.Allowed
}

func (n *Stack) release() { n.flows.Add(-1) }

// hostAddr is where nether dials for a guest destination: the gateway is
// the host's loopback.
func hostAddr(dst netip.AddrPort) netip.AddrPort {
	if dst.Addr() == GatewayAddr {
		return netip.AddrPortFrom(hostLoop, dst.Port())
	}
	return dst
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	b := a.As4()
	return netip.AddrPortFrom(netip.AddrFrom4(b), port)
}

// track registers a flow's closer so Close can end it.
func (n *Stack) track(c *flowConn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.conns[c] = struct{}{}
	return true
}

func (n *Stack) untrack(c *flowConn) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conns != nil {
		delete(n.conns, c)
	}
}

// flowConn is a flow's pair of connections.
type flowConn struct {
	once        sync.Once
	guest, host net.Conn
	tcp         bool
	id          GuestConn // the guest's side of a TCP flow
}

func (c *flowConn) close() {
	c.once.Do(func() {
		c.guest.Close()
		if c.host != nil {
			c.host.Close()
		}
	})
}
