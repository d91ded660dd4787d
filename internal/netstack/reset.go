package netstack

import (
	"net/netip"
	"slices"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// GuestConn is one of the guest's TCP connections through the stack,
// from the guest's point of view: Local is the guest's address and port,
// Remote the destination it connected to, SndNxt the next sequence
// number the guest will send and RcvNxt the next it expects (so a reset
// with sequence number RcvNxt is one the guest's kernel accepts). The
// numbers are read off the frames; RcvNxt assumes every segment the
// stack sent arrived.
type GuestConn struct {
	Local  netip.AddrPort `json:"local"`
	Remote netip.AddrPort `json:"remote"`
	SndNxt uint32         `json:"snd_nxt"`
	RcvNxt uint32         `json:"rcv_nxt"`
}

// GuestConns lists the guest's open TCP connections (relayed flows and
// DNS over TCP), for a capture: their host sockets cannot cross it.
func (n *Stack) GuestConns() []GuestConn {
	n.mu.Lock()
	var keys []connKey
	for c := range n.conns {
		if c.key != nil {
			keys = append(keys, *c.key)
		}
	}
	n.mu.Unlock()
	out := make([]GuestConn, 0, len(keys))
	for _, k := range keys {
		snd, rcv, ok := n.seqs.get(k)
		if !ok {
			continue
		}
		out = append(out, GuestConn{Local: netip.AddrPortFrom(GuestAddr, k.guestPort), Remote: k.remote, SndNxt: snd, RcvNxt: rcv})
	}
	slices.SortFunc(out, func(a, b GuestConn) int { return a.Local.Compare(b.Local) })
	return out
}

// ResetGuestConns makes the guest drop connections a capture carried,
// whose host sockets are gone. Each gets two frames:
//
//   - a RST at RcvNxt, which the guest's kernel accepts at once if the
//     numbers are right (RFC 5961 wants the exact number);
//   - a bare ACK out of the window, in case they are not (a segment was
//     in flight at the capture, or the record predates the numbers): the
//     guest answers it with an ACK carrying its own numbers, this stack
//     has no such connection and answers that with a RST at exactly the
//     sequence number the guest expects.
//
// A guest blocked in recv() sees the reset within a round trip, not a
// hang. Connections that are not the guest's IPv4 ones are skipped.
func (n *Stack) ResetGuestConns(cs []GuestConn) {
	for _, c := range cs {
		if c.Local.Addr() != GuestAddr || !c.Remote.Addr().Is4() {
			continue
		}
		n.inject(segmentFrame(c, c.RcvNxt, c.SndNxt, header.TCPFlagRst|header.TCPFlagAck))
		n.inject(segmentFrame(c, c.RcvNxt+1<<31, c.SndNxt+1<<31, header.TCPFlagAck))
	}
}

// segmentFrame is a bare TCP segment from c.Remote to c.Local.
func segmentFrame(c GuestConn, seq, ack uint32, flags header.TCPFlags) []byte {
	src, dst := tcpip.AddrFrom4(c.Remote.Addr().As4()), tcpip.AddrFrom4(c.Local.Addr().As4())
	seg := make([]byte, header.TCPMinimumSize)
	t := header.TCP(seg)
	t.Encode(&header.TCPFields{SrcPort: c.Remote.Port(), DstPort: c.Local.Port(), SeqNum: seq, AckNum: ack,
		DataOffset: header.TCPMinimumSize, Flags: flags, WindowSize: 1024})
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dst, header.TCPMinimumSize)
	t.SetChecksum(^checksum.Checksum(seg, xsum))
	return ipv4Frame(src, dst, header.TCPProtocolNumber, seg)
}
