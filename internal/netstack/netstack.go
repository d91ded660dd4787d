// Package netstack is a sandbox's user-mode network: the guest's NIC
// frames end in gVisor's TCP/IP stack (gvisor.dev/gvisor/pkg/tcpip),
// which terminates the guest's TCP and UDP; what the policy allows is
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

	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/pace"
)

// The guest's network.
var (
	GuestAddr   = netip.MustParseAddr("10.0.2.15")
	GatewayAddr = netip.MustParseAddr("10.0.2.2")
	DNSAddr     = netip.MustParseAddr("10.0.2.3")
	hostLoop    = netip.MustParseAddr("127.0.0.1")
	// guestMAC is the NIC's address (the engine's NICMAC); stackMAC is
	// the one the stack answers ARP with, QEMU's user network's.
	guestMAC = tcpip.LinkAddress("\x52\x54\x00\x12\x34\x56")
	stackMAC = tcpip.LinkAddress("\x52\x55\x0a\x00\x02\x02")
)

// Proto names a flow's transport.
type Proto string

// The transports.
const (
	TCP  Proto = "TCP"
	UDP  Proto = "UDP"
	ICMP Proto = "ICMP"
)

// Verdict is a policy's answer: whether the flow may go on, and the rule
// that decided, which the stack reports with the flow (Flow.Rule).
type Verdict struct {
	Allow bool
	Rule  string
}

// Policy decides a new flow by the address the guest asked for (dst):
// 10.0.2.2:port is decided as 10.0.2.2, though nether then dials the
// host's 127.0.0.1:port.
type Policy func(proto Proto, dst netip.AddrPort) Verdict

// Flow is one new flow attempt, allowed or not. Reason says why a flow
// the policy allowed was refused anyway ("flow limit", "half-open
// limit"), or is "".
type Flow struct {
	Proto   Proto
	Dst     netip.AddrPort
	Allowed bool
	Rule    string // the policy's Verdict.Rule
	Reason  string
}

// Config is a stack's configuration.
type Config struct {
	Policy      Policy        // required
	OnFlow      func(Flow)    // every new flow attempt, allowed or not; may be nil
	RateKbps    int64         // host -> guest cap in kilobits per second; 0 = unlimited
	MaxFlows    int           // concurrent TCP and UDP flows (default 1024)
	MaxHalfOpen int           // TCP connects in progress (default 128)
	Resolver    *net.Resolver // answers DNS at 10.0.2.3 (nil = net.DefaultResolver)
	DialTimeout time.Duration // a host connect's limit (default 10 s)
	Log         *slog.Logger

	// dial replaces the host dialer in tests.
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Stats are a stack's counters.
type Stats struct {
	TxBytes, RxBytes uint64 // payload the guest sent out, and received from outside
	Blocked          uint64 // flows the policy refused
	Refused          uint64 // flows a cap refused (flow limit, half-open limit)
	Dropped          uint64 // frames refused at the link: spoofed source, not ARP or IPv4
	DNSDropped       uint64 // DNS queries over the in-flight or rate bound, or malformed
	Flows            int    // TCP and UDP flows open now
}

// Stack is one sandbox's network.
type Stack struct {
	cfg   Config
	log   *slog.Logger
	link  *os.File // the engine's end, closed by Close
	io    *os.File // a non-blocking duplicate of link that Close can wake
	ch    *channel.Endpoint
	s     *stack.Stack
	ctx   context.Context
	stop  context.CancelFunc
	rate  *pace.Bucket // host -> guest; nil = unlimited
	dns   *dnsServer
	seqs  seqTable
	pings pingLog
	mac   atomic.Pointer[tcpip.LinkAddress] // the guest's MAC once SetGuestMAC changed it

	flows, halfOpen                               atomic.Int64
	tx, rx, blocked, refused, dropped, dnsDropped atomic.Uint64

	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup // every goroutine the stack started
	conns  map[*flowConn]struct{}
}

const (
	nicID = 1
	mtu   = engine.NICMTU
)

// New starts a stack on link, the host end of the NIC's frame channel
// (one Ethernet frame per message). The stack owns link from then on.
func New(cfg Config, link *os.File) (*Stack, error) {
	if cfg.Policy == nil {
		return nil, errors.New("netstack: no policy")
	}
	if link == nil {
		return nil, errors.New("netstack: no link")
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
	if cfg.dial == nil {
		var d net.Dialer
		cfg.dial = d.DialContext
	}
	io, err := pollable(link)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Stack{cfg: cfg, log: cfg.Log, link: link, io: io, ctx: ctx, stop: cancel,
		conns: map[*flowConn]struct{}{}}
	n.seqs.m = map[connKey]*seqState{}
	if cfg.RateKbps > 0 {
		n.rate = pace.New(cfg.RateKbps * 1000 / 8)
	}
	if err := n.build(); err != nil {
		n.s.Close()
		n.s.Wait()
		io.Close()
		cancel()
		return nil, err
	}
	n.wg.Add(2)
	go n.inbound()
	go n.outbound()
	return n, nil
}

// build makes the gVisor stack: one NIC holding the gateway's and the
// resolver's addresses, in promiscuous and spoofing mode so that every
// destination the guest reaches through the gateway lands in the
// forwarders, which decide it.
func (n *Stack) build() error {
	n.s = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	sack := tcpip.TCPSACKEnabled(true)
	n.s.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	n.ch = channel.New(512, mtu, stackMAC)
	if err := n.s.CreateNIC(nicID, ethernet.New(n.ch)); err != nil {
		return fmt.Errorf("netstack: creating the NIC: %v", err)
	}
	n.s.SetPromiscuousMode(nicID, true)
	n.s.SetSpoofing(nicID, true)
	for _, a := range []netip.Addr{GatewayAddr, DNSAddr} {
		pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
			AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(a.As4()), PrefixLen: 24}}
		if err := n.s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
			return fmt.Errorf("netstack: adding %s: %v", a, err)
		}
	}
	n.s.SetRouteTable([]tcpip.Route{{Destination: header.IPv4EmptySubnet, NIC: nicID}})
	// The forwarder's own in-flight cap is above MaxHalfOpen so that the
	// SYNs over our cap reach tcpFlow and get a reset and a report, not
	// silence; the margin bounds those short-lived refusals.
	tf := tcp.NewForwarder(n.s, 0, n.cfg.MaxHalfOpen+halfOpenMargin, n.tcpFlow)
	n.s.SetTransportProtocolHandler(tcp.ProtocolNumber, tf.HandlePacket)
	uf := udp.NewForwarder(n.s, n.udpFlow)
	n.s.SetTransportProtocolHandler(udp.ProtocolNumber, uf.HandlePacket)
	d, err := n.startDNS()
	if err != nil {
		return err
	}
	n.dns = d
	return nil
}

// Stats reads the counters.
func (n *Stack) Stats() Stats {
	return Stats{TxBytes: n.tx.Load(), RxBytes: n.rx.Load(), Blocked: n.blocked.Load(),
		Refused: n.refused.Load(), Dropped: n.dropped.Load(), DNSDropped: n.dnsDropped.Load(),
		Flows: int(n.flows.Load())}
}

// Close ends every flow, closes every host socket and the link, and
// returns once every goroutine the stack started has.
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
	n.stop() // ends dials, lookups and rate waits
	// Abort the guest's ends first: a graceful close would leave each
	// one waiting out FIN_WAIT for a guest that may be gone (a capture)
	// and s.Wait with it. The guest sees resets, as it would from a
	// host that went away.
	n.s.Close()
	for c := range conns {
		c.close()
	}
	n.dns.close()
	n.io.Close() // wakes inbound's read and outbound's write
	n.ch.Close()
	n.wg.Wait()
	n.s.Wait()
	if err := n.link.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
		return fmt.Errorf("netstack: closing the link: %w", err)
	}
	return nil
}

// spawn runs f on a goroutine Close waits for, unless the stack is
// closing.
func (n *Stack) spawn(f func()) bool {
	if !n.enter() {
		return false
	}
	go func() {
		defer n.wg.Done()
		f()
	}()
	return true
}

// enter counts the calling goroutine (one gVisor started) among those
// Close waits for; false once the stack is closing. The caller calls
// n.wg.Done when it returns.
func (n *Stack) enter() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.wg.Add(1)
	return true
}
