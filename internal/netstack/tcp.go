package netstack

import (
	"io"
	"net"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// tcpFlow handles a guest's SYN. The forwarder holds at most MaxHalfOpen
// of these at once (past it the SYN is dropped, and the guest retries),
// so a SYN flood costs a bounded number of goroutines.
func (n *Stack) tcpFlow(r *tcp.ForwarderRequest) {
	id := r.ID()
	dst := addrPort(id.LocalAddress, id.LocalPort)
	if !n.decide(TCP, dst) {
		// A reset at once: the guest sees "connection refused" in
		// milliseconds, never a timeout.
		r.Complete(true)
		return
	}
	hc, err := net.DialTimeout("tcp4", hostAddr(dst).String(), n.cfg.DialTimeout)
	if err != nil {
		n.release()
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		n.release()
		hc.Close()
		r.Complete(true)
		return
	}
	r.Complete(false)
	gc := gonet.NewTCPConn(&wq, ep)
	fc := &flowConn{guest: gc, host: hc, tcp: true,
		id: GuestConn{Local: addrPort(id.RemoteAddress, id.RemotePort), Remote: dst}}
	if !n.track(fc) {
		n.release()
		fc.close()
		return
	}
	go n.splice(fc)
}

// splice copies both ways until both are done, counting payload bytes;
// host -> guest goes through the rate cap.
func (n *Stack) splice(fc *flowConn) {
	defer n.release()
	defer n.untrack(fc)
	defer fc.close()
	done := make(chan struct{}, 2)
	go func() {
		k, _ := io.Copy(fc.host, fc.guest)
		n.tx.Add(uint64(k))
		if c, ok := fc.host.(*net.TCPConn); ok {
			c.CloseWrite()
		}
		done <- struct{}{}
	}()
	go func() {
		var src io.Reader = fc.host
		if n.rate != nil {
			src = &paced{r: fc.host, b: n.rate, ctx: n.ctx}
		}
		k, _ := io.Copy(fc.guest, src)
		n.rx.Add(uint64(k))
		if c, ok := fc.guest.(*gonet.TCPConn); ok {
			c.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}
