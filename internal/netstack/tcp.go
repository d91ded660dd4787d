package netstack

import (
	"context"
	"io"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/nethersandbox/nether/internal/pace"
)

// halfOpenMargin is how many SYNs over MaxHalfOpen may be in the
// forwarder at once, each only long enough to be refused with a reset.
const halfOpenMargin = 32

// tcpFlow handles a guest's SYN, on a goroutine of the forwarder's
// (at most MaxHalfOpen+halfOpenMargin at once, so a SYN flood costs a
// bounded number): a reset at once when the policy or a cap refuses it;
// otherwise the host connect first, and the guest's handshake completes
// only once it succeeded, so the guest sees the host's refusal as its
// own.
func (n *Stack) tcpFlow(r *tcp.ForwarderRequest) {
	if !n.enter() {
		r.Complete(true)
		return
	}
	defer n.wg.Done()
	id := r.ID()
	dst := addrPort(id.LocalAddress, id.LocalPort)
	if dst.Addr() == DNSAddr {
		// Port 53 has its listener (dns.go); nothing else listens on
		// the resolver's address.
		r.Complete(true)
		return
	}
	if n.halfOpen.Add(1) > int64(n.cfg.MaxHalfOpen) {
		n.halfOpen.Add(-1)
		v := n.cfg.Policy(TCP, dst)
		f := Flow{Proto: TCP, Dst: dst, Allowed: v.Allow, Rule: v.Rule}
		if f.Allowed {
			n.refuse(&f, reasonHalfOpen)
		} else {
			n.blocked.Add(1)
		}
		n.report(f)
		r.Complete(true)
		return
	}
	defer n.halfOpen.Add(-1)
	if !n.decide(TCP, dst) {
		// A reset at once: the guest sees "connection refused" in
		// milliseconds, never a timeout.
		r.Complete(true)
		return
	}
	ctx, cancel := context.WithTimeout(n.ctx, n.cfg.DialTimeout)
	hc, err := n.cfg.dial(ctx, "tcp4", hostAddr(dst).String())
	cancel()
	if err != nil {
		n.log.Debug("host connect failed", "dst", dst, "err", err)
		n.release()
		r.Complete(true)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		// The guest gave up (its SYN timed out) or sent garbage.
		n.release()
		hc.Close()
		r.Complete(true)
		return
	}
	r.Complete(false)
	key := connKey{remote: dst, guestPort: id.RemotePort}
	fc := &flowConn{guest: gonet.NewTCPConn(&wq, ep), host: hc, ep: ep, key: &key}
	if !n.track(fc) {
		n.release()
		fc.close()
		return
	}
	if !n.spawn(func() { n.splice(fc) }) {
		n.untrack(fc)
		n.release()
		fc.close()
	}
}

// splice copies both ways until both are done, counting payload bytes
// as they pass; host -> guest goes through the rate cap. A direction's
// end of stream is passed on as a half-close (a guest's
// shutdown(SHUT_WR) reaches the host peer as a FIN, and the other way
// round); an error on either side (a reset, a broken connection) resets
// both.
func (n *Stack) splice(fc *flowConn) {
	defer n.release()
	defer n.untrack(fc)
	defer fc.close()
	done := make(chan struct{}, 1)
	go func() {
		defer func() { done <- struct{}{} }()
		if _, err := io.Copy(counter{fc.host, &n.tx}, fc.guest); err != nil {
			fc.reset()
			return
		}
		if c, ok := fc.host.(interface{ CloseWrite() error }); ok {
			c.CloseWrite()
		}
	}()
	var src io.Reader = fc.host
	if n.rate != nil {
		src = &pace.Reader{R: fc.host, B: n.rate, Ctx: n.ctx}
	}
	if _, err := io.Copy(counter{fc.guest, &n.rx}, src); err != nil {
		fc.reset()
	} else if c, ok := fc.guest.(interface{ CloseWrite() error }); ok {
		c.CloseWrite()
	}
	<-done
}

// counter adds what is written through it to a counter as it goes, so
// that Stats sees a long transfer's progress.
type counter struct {
	w io.Writer
	c *atomic.Uint64
}

func (c counter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.c.Add(uint64(k))
	return k, err
}
