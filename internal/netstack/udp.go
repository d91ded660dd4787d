package netstack

import (
	"net"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// udpIdle ends a UDP flow nobody used for this long.
const udpIdle = 60 * time.Second

// udpFlow handles the first datagram of a guest's UDP flow: DNS to
// 10.0.2.3 is answered here; anything else is relayed on a host socket of
// its own if the policy allows it.
func (n *Stack) udpFlow(r *udp.ForwarderRequest) bool {
	id := r.ID()
	dst := addrPort(id.LocalAddress, id.LocalPort)
	if dst.Addr() == DNSAddr {
		if dst.Port() != 53 {
			return true // nothing else listens on the resolver's address
		}
		select {
		case n.dns <- struct{}{}:
		default:
			n.dropped.Add(1) // a query flood: the guest retries later
			return true
		}
		var wq waiter.Queue
		ep, err := r.CreateEndpoint(&wq)
		if err != nil {
			<-n.dns
			return true
		}
		go n.serveDNS(gonet.NewUDPConn(&wq, ep))
		return true
	}
	if !n.decide(UDP, dst) {
		return true
	}
	hc, err := net.Dial("udp4", hostAddr(dst).String())
	if err != nil {
		n.release()
		return true
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		n.release()
		hc.Close()
		return true
	}
	fc := &flowConn{guest: gonet.NewUDPConn(&wq, ep), host: hc}
	if !n.track(fc) {
		n.release()
		fc.close()
		return true
	}
	go n.relayUDP(fc)
	return true
}

// relayUDP moves datagrams both ways until the flow idles.
func (n *Stack) relayUDP(fc *flowConn) {
	defer n.release()
	defer n.untrack(fc)
	defer fc.close()
	done := make(chan struct{}, 2)
	move := func(from, to net.Conn, count func(int), pace bool) {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 65536)
		for {
			from.SetReadDeadline(time.Now().Add(udpIdle))
			k, err := from.Read(buf)
			if err != nil {
				return
			}
			if pace && n.rate != nil {
				if n.rate.take(n.ctx, k) != nil {
					return
				}
			}
			if _, err := to.Write(buf[:k]); err == nil {
				count(k)
			}
		}
	}
	go move(fc.guest, fc.host, func(k int) { n.tx.Add(uint64(k)) }, false)
	go move(fc.host, fc.guest, func(k int) { n.rx.Add(uint64(k)) }, true)
	<-done
	fc.close()
	<-done
}
