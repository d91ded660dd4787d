package netstack

import (
	"net/netip"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// ICMP echo is answered by nether, not forwarded: nether opens no ICMP
// socket on the host. A guest's ping to the gateway, the resolver, or an
// address the policy allows gets its reply from the stack at once (so
// ping tells that the policy allows an address, not that the address is
// up); one the policy refuses gets a "communication administratively
// prohibited" unreachable, so ping fails at once instead of timing out.
// Fragmented echo requests are dropped.

// ping answers an echo request frame; false for any other frame, which
// goes on into the stack.
func (n *Stack) ping(f []byte) bool {
	if header.Ethernet(f).Type() != header.IPv4ProtocolNumber {
		return false
	}
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	if ip.TransportProtocol() != header.ICMPv4ProtocolNumber {
		return false
	}
	if ip.More() || ip.FragmentOffset() != 0 {
		return true
	}
	ic := header.ICMPv4(ip.Payload())
	if len(ic) < header.ICMPv4MinimumSize || ic.Type() != header.ICMPv4Echo {
		return false
	}
	if checksum.Checksum(ic, 0) != 0xffff {
		n.dropped.Add(1)
		return true
	}
	dst := netip.AddrFrom4(ip.DestinationAddress().As4())
	v := Verdict{Allow: true, Rule: "the stack's own address"}
	if dst != GatewayAddr && dst != DNSAddr {
		v = n.cfg.Policy(ICMP, netip.AddrPortFrom(dst, 0))
	}
	allowed := v.Allow
	if n.pings.first(dst, ic.Ident()) {
		if !allowed {
			n.blocked.Add(1)
		}
		n.report(Flow{Proto: ICMP, Dst: netip.AddrPortFrom(dst, 0), Allowed: allowed, Rule: v.Rule})
	}
	var reply []byte
	if allowed {
		reply = echoReply(ip, ic)
	} else {
		reply = prohibited(ip)
	}
	n.inject(reply)
	return true
}

// echoReply answers an echo request with its own identifier, sequence
// number and data, from the address it was sent to.
func echoReply(req header.IPv4, ic header.ICMPv4) []byte {
	body := append([]byte(nil), ic...)
	r := header.ICMPv4(body)
	r.SetType(header.ICMPv4EchoReply)
	r.SetCode(0)
	r.SetChecksum(0)
	r.SetChecksum(^checksum.Checksum(body, 0))
	return ipv4Frame(req.DestinationAddress(), req.SourceAddress(), header.ICMPv4ProtocolNumber, body)
}

// prohibited is the ICMP destination unreachable, code 13
// (communication administratively prohibited), for a refused request:
// it quotes the request's IP header and first 8 bytes, as RFC 792 asks.
// It comes from the gateway, as a router's would.
func prohibited(req header.IPv4) []byte {
	quote := req[:min(len(req), int(req.HeaderLength())+8)]
	body := make([]byte, header.ICMPv4MinimumSize+len(quote))
	r := header.ICMPv4(body)
	r.SetType(header.ICMPv4DstUnreachable)
	r.SetCode(header.ICMPv4AdminProhibited)
	copy(body[header.ICMPv4MinimumSize:], quote)
	r.SetChecksum(^checksum.Checksum(body, 0))
	return ipv4Frame(tcpip.AddrFrom4(GatewayAddr.As4()), req.SourceAddress(), header.ICMPv4ProtocolNumber, body)
}

// ipv4Frame wraps a transport payload in IPv4 and Ethernet, to the guest.
func ipv4Frame(src, dst tcpip.Address, proto tcpip.TransportProtocolNumber, payload []byte) []byte {
	ipLen := header.IPv4MinimumSize + len(payload)
	f := make([]byte, header.EthernetMinimumSize+ipLen)
	header.Ethernet(f).Encode(&header.EthernetFields{SrcAddr: stackMAC, DstAddr: guestMAC, Type: header.IPv4ProtocolNumber})
	ip := header.IPv4(f[header.EthernetMinimumSize:])
	ip.Encode(&header.IPv4Fields{TotalLength: uint16(ipLen), TTL: 64, Protocol: uint8(proto), SrcAddr: src, DstAddr: dst})
	ip.SetChecksum(^ip.CalculateChecksum())
	copy(ip[header.IPv4MinimumSize:], payload)
	return f
}

// pingLog remembers the (destination, identifier) pairs already
// reported, so that one ping run is one flow in the log, not one per
// second. It forgets everything past pingLogMax entries: memory stays
// bounded, and a forgotten run is reported once more.
type pingLog struct {
	mu   sync.Mutex
	seen map[pingKey]struct{}
}

type pingKey struct {
	dst   netip.Addr
	ident uint16
}

const pingLogMax = 256

func (p *pingLog) first(dst netip.Addr, ident uint16) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := pingKey{dst, ident}
	if _, ok := p.seen[k]; ok {
		return false
	}
	if p.seen == nil || len(p.seen) >= pingLogMax {
		p.seen = map[pingKey]struct{}{}
	}
	p.seen[k] = struct{}{}
	return true
}
