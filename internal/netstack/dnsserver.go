package netstack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/nethersandbox/nether/internal/pace"
)

// The resolver's bounds: a guest flooding 10.0.2.3 costs at most
// dnsInFlight lookups and goroutines at once, dnsRate queries a second
// on average, and dnsTCPConns connections; the excess is dropped and
// counted (Stats.DNSDropped), and the guest's resolver retries.
const (
	dnsInFlight = 64
	dnsRate     = 200
	dnsBurst    = 100
	dnsTCPConns = 16
	dnsTCPIdle  = 10 * time.Second
	dnsUDPMax   = 512 // without EDNS, a UDP answer's bound
	dnsTCPMax   = 65535
)

// dnsServer is the resolver at 10.0.2.3:53, over UDP and TCP. Its
// endpoints are bound in the stack, so the forwarders never see its
// traffic.
type dnsServer struct {
	udp   *gonet.UDPConn
	tcp   *gonet.TCPListener
	slots chan struct{} // lookups in flight
	conns chan struct{} // TCP connections open
	rate  *pace.Bucket  // queries, not bytes
}

func (n *Stack) startDNS() (*dnsServer, error) {
	addr := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(DNSAddr.As4()), Port: 53}
	u, err := gonet.DialUDP(n.s, &addr, nil, ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("netstack: binding DNS over UDP: %w", err)
	}
	l, err := gonet.ListenTCP(n.s, addr, ipv4.ProtocolNumber)
	if err != nil {
		u.Close()
		return nil, fmt.Errorf("netstack: binding DNS over TCP: %w", err)
	}
	d := &dnsServer{udp: u, tcp: l, slots: make(chan struct{}, dnsInFlight),
		conns: make(chan struct{}, dnsTCPConns), rate: pace.NewBurst(dnsRate, dnsBurst)}
	n.wg.Add(2)
	go func() { defer n.wg.Done(); n.serveDNSUDP(d) }()
	go func() { defer n.wg.Done(); n.serveDNSTCP(d) }()
	return d, nil
}

func (d *dnsServer) close() {
	d.udp.Close()
	d.tcp.Close()
}

// admit takes a lookup slot for one query, or counts it dropped.
func (n *Stack) admit(d *dnsServer) bool {
	if !d.rate.Allow(1) {
		n.dnsDropped.Add(1)
		return false
	}
	select {
	case d.slots <- struct{}{}:
		return true
	default:
		n.dnsDropped.Add(1)
		return false
	}
}

// serveDNSUDP reads queries and answers each on a goroutine of its own,
// within the bounds.
func (n *Stack) serveDNSUDP(d *dnsServer) {
	buf := make([]byte, 65536)
	for {
		k, from, err := d.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		if !n.admit(d) {
			continue
		}
		q := append([]byte(nil), buf[:k]...)
		if !n.spawn(func() {
			defer func() { <-d.slots }()
			resp, ok := n.answer(q, dnsUDPMax)
			if !ok {
				n.dnsDropped.Add(1)
				return
			}
			d.udp.WriteTo(resp, from)
		}) {
			<-d.slots
		}
	}
}

// serveDNSTCP accepts connections (RFC 7766: length-prefixed messages,
// answered in order) up to its bound.
func (n *Stack) serveDNSTCP(d *dnsServer) {
	for {
		c, err := d.tcp.Accept()
		if err != nil {
			return
		}
		select {
		case d.conns <- struct{}{}:
		default:
			n.dnsDropped.Add(1)
			c.Close()
			continue
		}
		fc := &flowConn{guest: c}
		if ra, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			fc.key = &connKey{remote: netip.AddrPortFrom(DNSAddr, 53), guestPort: uint16(ra.Port)}
		}
		if !n.track(fc) {
			c.Close()
			<-d.conns
			continue
		}
		if !n.spawn(func() {
			defer func() { <-d.conns }()
			defer n.untrack(fc)
			defer fc.close()
			n.dnsConn(d, c)
		}) {
			n.untrack(fc)
			fc.close()
			<-d.conns
		}
	}
}

// dnsConn answers one TCP connection's queries until it idles or ends.
func (n *Stack) dnsConn(d *dnsServer, c net.Conn) {
	buf := make([]byte, dnsTCPMax)
	for {
		c.SetReadDeadline(time.Now().Add(dnsTCPIdle))
		var l [2]byte
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return
		}
		k := int(binary.BigEndian.Uint16(l[:]))
		if _, err := io.ReadFull(c, buf[:k]); err != nil {
			return
		}
		if !n.admit(d) {
			return
		}
		resp, ok := n.answer(buf[:k], dnsTCPMax)
		<-d.slots
		if !ok {
			n.dnsDropped.Add(1)
			return
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(resp)), uint16(len(resp)))
		c.SetWriteDeadline(time.Now().Add(dnsTCPIdle))
		if _, err := c.Write(append(out, resp...)); err != nil {
			if !errors.Is(err, net.ErrClosed) {
				n.log.Debug("answering DNS over TCP", "err", err)
			}
			return
		}
	}
}
