package netstack

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
)

// Refusal reasons, as Flow.Reason reports them.
const (
	reasonFlows    = "flow limit"
	reasonHalfOpen = "half-open limit"
)

// decide applies the policy and the flow cap to a new flow and reports
// it. A flow it admits holds a slot until release.
func (n *Stack) decide(proto Proto, dst netip.AddrPort) bool {
	v := n.cfg.Policy(proto, dst)
	f := Flow{Proto: proto, Dst: dst, Allowed: v.Allow, Rule: v.Rule}
	if !f.Allowed {
		n.blocked.Add(1)
	} else if n.flows.Add(1) > int64(n.cfg.MaxFlows) {
		n.flows.Add(-1)
		n.refuse(&f, reasonFlows)
	}
	n.report(f)
	return f.Allowed
}

// refuse turns an allowed flow into one a cap refused.
func (n *Stack) refuse(f *Flow, reason string) {
	n.refused.Add(1)
	f.Allowed, f.Reason = false, reason
}

func (n *Stack) report(f Flow) {
	if n.cfg.OnFlow != nil {
		n.cfg.OnFlow(f)
	}
}

func (n *Stack) release() { n.flows.Add(-1) }

// hostAddr is where nether dials for a guest destination: the gateway is
// the host's loopback.
func hostAddr(dst netip.AddrPort) netip.AddrPort {
	if dst.Addr() == GatewayAddr {
		return netip.AddrPortFrom(hostLoop, dst.Port())
	}
	return dst
}

func addrPort(a tcpip.Address, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4(a.As4()), port)
}

// flowConn is a flow's pair of connections: the guest's end in the
// stack, and the host socket (nil for flows nether answers itself).
type flowConn struct {
	once        sync.Once
	guest, host net.Conn
	ep          tcpip.Endpoint // a TCP flow's guest end, for reset
	key         *connKey       // a TCP flow's, for GuestConns
}

// close ends both ends; a deadline first wakes any goroutine blocked on
// the guest's end.
func (c *flowConn) close() { c.end(false) }

// reset ends a TCP flow with a reset on both sides, as a NAT passes one
// on: a peer that reset its end (or whose connection broke) is seen as
// a reset by the other, never as an orderly end of stream that could
// pass a truncated transfer for a whole one.
func (c *flowConn) reset() { c.end(true) }

func (c *flowConn) end(reset bool) {
	c.once.Do(func() {
		if reset {
			if c.ep != nil {
				c.ep.Abort()
			}
			if tc, ok := c.host.(*net.TCPConn); ok {
				tc.SetLinger(0) // close sends a reset
			}
		}
		c.guest.SetDeadline(time.Now())
		c.guest.Close()
		if c.host != nil {
			c.host.Close()
		}
	})
}

// track registers a flow so that Close ends it (and a TCP one's
// sequence numbers); false once the stack is closing.
func (n *Stack) track(c *flowConn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.conns[c] = struct{}{}
	if c.key != nil {
		n.seqs.add(*c.key)
	}
	return true
}

func (n *Stack) untrack(c *flowConn) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.conns != nil {
		delete(n.conns, c)
	}
	if c.key != nil {
		n.seqs.remove(*c.key)
	}
}
