package netstack

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// GuestConn is one of the guest's TCP connections through the stack,
// from the guest's side: Local is the guest's address and port, Remote
// the destination it connected to.
type GuestConn struct {
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
}

// guestMAC is the NIC's address (the engine's NICMAC).
var guestMAC = tcpip.LinkAddress("\x52\x54\x00\x12\x34\x56")

// GuestConns lists the guest's open TCP connections, for a capture: their
// host sockets cannot cross it.
func (n *Stack) GuestConns() []GuestConn {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []GuestConn
	for c := range n.conns {
		if c.tcp {
			out = append(out, c.id)
		}
	}
	return out
}

// ResetGuestConns makes the guest drop connections a capture carried,
// whose host sockets are gone. nether does not know their sequence
// numbers, so it sends each a bare ACK out of the window: the guest's
// kernel answers with an ACK that carries its own sequence numbers
// (RFC 5961's challenge ACK), this stack has no such connection and
// answers that with a reset at exactly the sequence number the guest
// expects. A guest blocked in recv() sees the reset within a round trip,
// not a hang.
func (n *Stack) ResetGuestConns(cs []GuestConn) {
	for _, c := range cs {
		if !c.Local.Addr().Is4() || !c.Remote.Addr().Is4() {
			continue
		}
		n.link.Write(probeFrame(c))
	}
}

// probeFrame is the out-of-window ACK from c.Remote to c.Local.
func probeFrame(c GuestConn) []byte {
	const ipLen = header.IPv4MinimumSize + header.TCPMinimumSize
	f := make([]byte, header.EthernetMinimumSize+ipLen)
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: stackMAC, DstAddr: guestMAC, Type: header.IPv4ProtocolNumber})
	src, dst := tcpip.AddrFrom4(c.Remote.Addr().As4()), tcpip.AddrFrom4(c.Local.Addr().As4())
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{TotalLength: ipLen, TTL: 64, Protocol: uint8(header.TCPProtocolNumber), SrcAddr: src, DstAddr: dst})
	ip.SetChecksum(^ip.CalculateChecksum())
	t := header.TCP(ip[header.IPv4MinimumSize:])
	t.Encode(&header.TCPFields{SrcPort: c.Remote.Port(), DstPort: c.Local.Port(), SeqNum: 1, AckNum: 1,
		DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagAck, WindowSize: 1024})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, header.TCPMinimumSize)
	t.SetChecksum(^t.CalculateChecksum(xsum))
	return f
}
