package netstack

import (
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// gVisor does not export a connection's sequence numbers, and a capture
// needs the guest's: so the link pumps read them off the frames of the
// connections registered here (the established TCP flows).

// connKey names a guest TCP connection by its remote end and the guest's
// port (the guest's address is always GuestAddr).
type connKey struct {
	remote    netip.AddrPort
	guestPort uint16
}

// seqState is what the frames said of one connection, from the guest's
// point of view: sndNxt, the next sequence number the guest will send;
// rcvNxt, the next it expects, which is where the stack's data ends.
type seqState struct {
	sndNxt, rcvNxt uint32
	sndSet, rcvSet bool
}

type seqTable struct {
	mu sync.RWMutex
	m  map[connKey]*seqState
}

func (t *seqTable) add(k connKey) {
	t.mu.Lock()
	t.m[k] = &seqState{}
	t.mu.Unlock()
}

func (t *seqTable) remove(k connKey) {
	t.mu.Lock()
	delete(t.m, k)
	t.mu.Unlock()
}

// get reads one connection's numbers.
func (t *seqTable) get(k connKey) (sndNxt, rcvNxt uint32, ok bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	s := t.m[k]
	if s == nil {
		return 0, 0, false
	}
	return s.sndNxt, s.rcvNxt, true
}

// tcpSegment picks a TCP segment out of an IPv4 Ethernet frame the
// stack has already checked (inbound) or built (outbound).
func tcpSegment(f []byte) (header.IPv4, header.TCP, bool) {
	if len(f) < header.EthernetMinimumSize || header.Ethernet(f).Type() != header.IPv4ProtocolNumber {
		return nil, nil, false
	}
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) || ip.TransportProtocol() != header.TCPProtocolNumber || ip.FragmentOffset() != 0 {
		return nil, nil, false
	}
	t := header.TCP(ip.Payload())
	if len(t) < header.TCPMinimumSize || int(t.DataOffset()) > len(t) {
		return nil, nil, false
	}
	return ip, t, true
}

// segEnd is the sequence number after a segment: its data, and one each
// for SYN and FIN.
func segEnd(t header.TCP) uint32 {
	end := t.SequenceNumber() + uint32(len(t)-int(t.DataOffset()))
	if t.Flags().Contains(header.TCPFlagSyn) {
		end++
	}
	if t.Flags().Contains(header.TCPFlagFin) {
		end++
	}
	return end
}

// after reports whether a comes after b in sequence space.
func after(a, b uint32) bool { return int32(a-b) > 0 }

// fromGuest notes a segment the guest sent: its end is the guest's
// sndNxt, its acknowledgment a floor for the guest's rcvNxt.
func (t *seqTable) fromGuest(f []byte) {
	ip, seg, ok := tcpSegment(f)
	if !ok {
		return
	}
	k := connKey{remote: netip.AddrPortFrom(netip.AddrFrom4(ip.DestinationAddress().As4()), seg.DestinationPort()),
		guestPort: seg.SourcePort()}
	t.mu.RLock()
	s := t.m[k]
	if s != nil {
		t.mu.RUnlock()
		t.mu.Lock()
		if end := segEnd(seg); !s.sndSet || after(end, s.sndNxt) {
			s.sndNxt, s.sndSet = end, true
		}
		if ack := seg.AckNumber(); seg.Flags().Contains(header.TCPFlagAck) && (!s.rcvSet || after(ack, s.rcvNxt)) {
			s.rcvNxt, s.rcvSet = ack, true
		}
		t.mu.Unlock()
		return
	}
	t.mu.RUnlock()
}

// toGuest notes a segment the stack sends the guest: its end is what the
// guest will expect next once it arrives.
func (t *seqTable) toGuest(f []byte) {
	ip, seg, ok := tcpSegment(f)
	if !ok {
		return
	}
	k := connKey{remote: netip.AddrPortFrom(netip.AddrFrom4(ip.SourceAddress().As4()), seg.SourcePort()),
		guestPort: seg.DestinationPort()}
	t.mu.RLock()
	s := t.m[k]
	t.mu.RUnlock()
	if s == nil {
		return
	}
	t.mu.Lock()
	if end := segEnd(seg); !s.rcvSet || after(end, s.rcvNxt) {
		s.rcvNxt, s.rcvSet = end, true
	}
	t.mu.Unlock()
}
