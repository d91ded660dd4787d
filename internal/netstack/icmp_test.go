package netstack

import (
	"net/netip"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// echoRequest is a guest's ping frame.
func echoRequest(src netip.Addr, srcMAC tcpip.LinkAddress, dst netip.Addr, ident uint16) []byte {
	body := make([]byte, header.ICMPv4MinimumSize+8)
	ic := header.ICMPv4(body)
	ic.SetType(header.ICMPv4Echo)
	ic.SetIdent(ident)
	ic.SetSequence(1)
	copy(body[header.ICMPv4MinimumSize:], "netherpg")
	ic.SetChecksum(^checksum.Checksum(body, 0))
	f := ipv4Frame(tcpip.AddrFrom4(src.As4()), tcpip.AddrFrom4(dst.As4()), header.ICMPv4ProtocolNumber, body)
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: srcMAC, DstAddr: stackMAC, Type: header.IPv4ProtocolNumber})
	return f
}

// sniffICMP hands the guest's test the ICMP frames from the stack.
func sniffICMP(g *guest) chan header.ICMPv4 {
	got := make(chan header.ICMPv4, 16)
	g.setSniff(func(f []byte) bool {
		if header.Ethernet(f).Type() != header.IPv4ProtocolNumber {
			return false
		}
		ip := header.IPv4(f[header.EthernetMinimumSize:])
		if ip.TransportProtocol() != header.ICMPv4ProtocolNumber {
			return false
		}
		select {
		case got <- header.ICMPv4(ip.Payload()):
		default:
		}
		return true
	})
	return got
}

func TestPing(t *testing.T) {
	blocked := netip.MustParseAddr("192.0.2.9")
	r := newRig(t, Config{Policy: func(_ Proto, dst netip.AddrPort) Verdict { return Verdict{Allow: dst.Addr() != blocked} }})
	got := sniffICMP(r.g)
	for _, tc := range []struct {
		dst  netip.Addr
		typ  header.ICMPv4Type
		code header.ICMPv4Code
	}{
		{GatewayAddr, header.ICMPv4EchoReply, 0},
		{netip.MustParseAddr("192.0.2.1"), header.ICMPv4EchoReply, 0},
		{blocked, header.ICMPv4DstUnreachable, header.ICMPv4AdminProhibited},
	} {
		t.Run(tc.dst.String(), func(t *testing.T) {
			r.g.write(echoRequest(GuestAddr, guestMAC, tc.dst, 42))
			select {
			case ic := <-got:
				if ic.Type() != tc.typ || ic.Code() != tc.code || checksum.Checksum(ic, 0) != 0xffff {
					t.Fatalf("type %d code %d, want %d %d", ic.Type(), ic.Code(), tc.typ, tc.code)
				}
				if tc.typ == header.ICMPv4EchoReply && (ic.Ident() != 42 || string(ic.Payload()) != "netherpg") {
					t.Fatalf("reply ident %d payload %q", ic.Ident(), ic.Payload())
				}
			case <-time.After(2 * time.Second):
				t.Fatal("no answer")
			}
		})
	}
	if s := r.n.Stats(); s.Blocked != 1 {
		t.Fatalf("stats %+v, want one blocked", s)
	}
}

// TestSpoofed: frames with another source address or MAC are dropped
// and counted, and reach nothing.
func TestSpoofed(t *testing.T) {
	srv := udpEcho(t)
	var flows int
	r := newRig(t, Config{OnFlow: func(Flow) { flows++ }})
	got := sniffICMP(r.g)
	other := netip.MustParseAddr("10.0.2.99")
	for _, f := range [][]byte{
		echoRequest(other, guestMAC, GatewayAddr, 1),
		echoRequest(GuestAddr, tcpip.LinkAddress("\x52\x54\x00\x00\x00\x01"), GatewayAddr, 2),
		udpFrame(other, gw(srv.LocalAddr())),
		{1, 2, 3}, // runt
	} {
		r.g.write(f)
	}
	waitFor(t, func() bool { return r.n.Stats().Dropped == 4 })
	select {
	case <-got:
		t.Fatal("a spoofed ping was answered")
	case <-time.After(200 * time.Millisecond):
	}
	if s := r.n.Stats(); flows != 0 || s.Flows != 0 {
		t.Fatalf("a spoofed datagram made a flow: %+v", s)
	}
}

func udpFrame(src netip.Addr, dst netip.AddrPort) []byte {
	seg := make([]byte, header.UDPMinimumSize+4)
	u := header.UDP(seg)
	u.Encode(&header.UDPFields{SrcPort: 4000, DstPort: dst.Port(), Length: uint16(len(seg))})
	copy(seg[header.UDPMinimumSize:], "boo!")
	s, d := tcpip.AddrFrom4(src.As4()), tcpip.AddrFrom4(dst.Addr().As4())
	u.SetChecksum(^checksum.Checksum(seg, header.PseudoHeaderChecksum(header.UDPProtocolNumber, s, d, uint16(len(seg)))))
	f := ipv4Frame(s, d, header.UDPProtocolNumber, seg)
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: guestMAC, DstAddr: stackMAC, Type: header.IPv4ProtocolNumber})
	return f
}
