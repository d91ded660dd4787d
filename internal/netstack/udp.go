package netstack

import (
	"context"
	"net"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// udpIdle ends a UDP flow that carried nothing either way for this long.
const udpIdle = 60 * time.Second

// udpFlow handles the first datagram of a guest's UDP flow (a new
// guest port and destination), on the stack's packet path: if the
// policy and the flow cap allow it, the flow gets a host socket of its
// own. DNS to 10.0.2.3:53 never reaches here (dns.go binds it); any other
// port on 10.0.2.3 is dropped.
func (n *Stack) udpFlow(r *udp.ForwarderRequest) bool {
	id := r.ID()
	dst := addrPort(id.LocalAddress, id.LocalPort)
	if dst.Addr() == DNSAddr {
		return true
	}
	if !n.decide(UDP, dst) {
		return true
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.DialTimeout)
	hc, err := n.cfg.dial(ctx, "udp4", hostAddr(dst).String())
	cancel()
	if err != nil {
		n.log.Debug("host UDP socket failed", "dst", dst, "err", err)
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
	if !n.spawn(func() { n.relayUDP(fc) }) {
		n.untrack(fc)
		n.release()
		fc.close()
	}
	return true
}

// relayUDP moves datagrams both ways until the flow idles: a datagram
// either way keeps both directions alive. Host -> guest waits for the
// rate cap; meanwhile the host kernel's socket buffer holds what
// arrives and drops the excess, as a slow link would.
func (n *Stack) relayUDP(fc *flowConn) {
	defer n.release()
	defer n.untrack(fc)
	defer fc.close()
	var last atomicTime
	last.touch()
	done := make(chan struct{}, 1)
	move := func(from, to net.Conn, c *counter, pace bool) {
		buf := make([]byte, 65536)
		for {
			// Wake every idle period to see whether the other
			// direction kept the flow alive.
			from.SetReadDeadline(time.Now().Add(udpIdle))
			k, err := from.Read(buf)
			if err != nil {
				if isTimeout(err) && !last.idle(udpIdle) {
					continue
				}
				return
			}
			last.touch()
			if pace && n.rate != nil && n.rate.Take(n.ctx, k) != nil {
				return
			}
			c.Write(buf[:k]) // a datagram lost on the way is lost
		}
	}
	go func() {
		defer func() { done <- struct{}{} }()
		move(fc.guest, fc.host, &counter{fc.host, &n.tx}, false)
		fc.close()
	}()
	move(fc.host, fc.guest, &counter{fc.guest, &n.rx}, true)
	fc.close()
	<-done
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}
