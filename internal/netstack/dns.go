package netstack

import (
	"context"
	"errors"
	"net"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// serveDNS answers one guest UDP flow of queries to 10.0.2.3 through the
// host's resolver, as Go's resolver sees it (/etc/hosts, then the host's
// nameservers), until it idles. A flow holds one of a bounded number of
// slots (Stack.dns), so a query flood costs bounded work.
func (n *Stack) serveDNS(c net.Conn) {
	defer func() { <-n.dns }()
	defer c.Close()
	buf := make([]byte, 1500)
	for {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		k, err := c.Read(buf)
		if err != nil {
			return
		}
		resp, ok := n.answer(buf[:k])
		if ok {
			c.Write(resp)
		}
	}
}

// answer resolves a query: A records for the name, an empty answer for
// other types of a name that exists, NXDOMAIN for one that does not,
// SERVFAIL when the resolver fails.
func (n *Stack) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		n.dropped.Add(1)
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		n.dropped.Add(1)
		return nil, false
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	var ips []net.IP
	if q.Class == dnsmessage.ClassINET && (q.Type == dnsmessage.TypeA || q.Type == dnsmessage.TypeAAAA) {
		ctx, cancel := context.WithTimeout(n.ctx, 4*time.Second)
		ips, err = n.cfg.Resolver.LookupIP(ctx, "ip4", q.Name.String())
		cancel()
		var de *net.DNSError
		switch {
		case errors.As(err, &de) && de.IsNotFound:
			rh.RCode = dnsmessage.RCodeNameError
		case err != nil:
			rh.RCode = dnsmessage.RCodeServerFailure
		}
		if q.Type == dnsmessage.TypeAAAA {
			ips = nil // the guest's network is IPv4 only
		}
	} else {
		rh.RCode = dnsmessage.RCodeNotImplemented
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), rh)
	b.EnableCompression()
	b.StartQuestions()
	b.Question(q)
	b.StartAnswers()
	for _, ip := range ips {
		v4 := ip.To4()
		if v4 == nil {
			continue
		}
		b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 30}, dnsmessage.AResource{A: [4]byte(v4)})
	}
	out, err := b.Finish()
	if err != nil {
		return nil, false
	}
	return out, true
}
