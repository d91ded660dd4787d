package netstack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// dnsTTL is the TTL of every answer: short, since the host's own
// resolver may know better a minute later.
const dnsTTL = 30

// lookupTimeout bounds one query's lookups, below a guest resolver's
// usual 5 s retry.
const lookupTimeout = 4 * time.Second

// answer resolves one query through the configured resolver, as Go's
// resolver sees the name (the host's /etc/hosts, then its nameservers):
// A records, after the CNAME Go reports as the canonical name; an empty
// answer for AAAA of a name that exists (the guest's network is IPv4
// only); PTR for in-addr.arpa names; NXDOMAIN for a name that does not
// resolve, SERVFAIL when the resolver fails, NOTIMP for other types.
// maxLen is the transport's bound (512 for UDP): past it the answer is
// sent truncated (TC) so the guest retries over TCP. ok is false for a
// message that is no query at all, which gets no answer.
func (n *Stack) answer(query []byte, maxLen int) (resp []byte, ok bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil || h.Response {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil {
		return nil, false
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode,
		RecursionDesired: h.RecursionDesired, RecursionAvailable: true}
	if len(qs) != 1 || h.OpCode != 0 {
		rh.RCode = dnsmessage.RCodeNotImplemented
		if len(qs) != 1 {
			rh.RCode = dnsmessage.RCodeFormatError
		}
		return build(rh, qs, nil, maxLen)
	}
	q := qs[0]
	ctx, cancel := context.WithTimeout(n.ctx, lookupTimeout)
	defer cancel()
	rrs, rcode := n.resolve(ctx, q)
	rh.RCode = rcode
	return build(rh, qs, rrs, maxLen)
}

// resolve looks one question up.
func (n *Stack) resolve(ctx context.Context, q dnsmessage.Question) ([]dnsmessage.Resource, dnsmessage.RCode) {
	if q.Class != dnsmessage.ClassINET {
		return nil, dnsmessage.RCodeNotImplemented
	}
	r := n.cfg.Resolver
	name := q.Name.String()
	rh := func(name dnsmessage.Name, t dnsmessage.Type) dnsmessage.ResourceHeader {
		return dnsmessage.ResourceHeader{Name: name, Type: t, Class: dnsmessage.ClassINET, TTL: dnsTTL}
	}
	switch q.Type {
	case dnsmessage.TypeA:
		ips, err := r.LookupNetIP(ctx, "ip4", name)
		if err != nil {
			return nil, rcodeOf(err)
		}
		var rrs []dnsmessage.Resource
		owner := q.Name
		// Go reports only the chain's end, so the answer carries one
		// CNAME from the asked name to it.
		if cname, err := r.LookupCNAME(ctx, name); err == nil && !strings.EqualFold(cname, name) {
			if cn, err := dnsmessage.NewName(cname); err == nil {
				rrs = append(rrs, dnsmessage.Resource{Header: rh(q.Name, dnsmessage.TypeCNAME), Body: &dnsmessage.CNAMEResource{CNAME: cn}})
				owner = cn
			}
		}
		for _, ip := range ips {
			if ip = ip.Unmap(); ip.Is4() {
				rrs = append(rrs, dnsmessage.Resource{Header: rh(owner, dnsmessage.TypeA), Body: &dnsmessage.AResource{A: ip.As4()}})
			}
		}
		return rrs, dnsmessage.RCodeSuccess
	case dnsmessage.TypeAAAA:
		if _, err := r.LookupNetIP(ctx, "ip", name); err != nil {
			return nil, rcodeOf(err)
		}
		return nil, dnsmessage.RCodeSuccess
	case dnsmessage.TypePTR:
		ip, ok := reverseName(name)
		if !ok {
			return nil, dnsmessage.RCodeNameError
		}
		names, err := r.LookupAddr(ctx, ip.String())
		if err != nil {
			return nil, rcodeOf(err)
		}
		var rrs []dnsmessage.Resource
		for _, s := range names {
			if pn, err := dnsmessage.NewName(dotted(s)); err == nil {
				rrs = append(rrs, dnsmessage.Resource{Header: rh(q.Name, dnsmessage.TypePTR), Body: &dnsmessage.PTRResource{PTR: pn}})
			}
		}
		return rrs, dnsmessage.RCodeSuccess
	}
	return nil, dnsmessage.RCodeNotImplemented
}

// rcodeOf maps a lookup error: a name that does not exist is NXDOMAIN,
// anything else (a timeout, an unreachable server) SERVFAIL.
func rcodeOf(err error) dnsmessage.RCode {
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return dnsmessage.RCodeNameError
	}
	return dnsmessage.RCodeServerFailure
}

func dotted(s string) string {
	if strings.HasSuffix(s, ".") {
		return s
	}
	return s + "."
}

// reverseName reads an IPv4 in-addr.arpa name.
func reverseName(name string) (netip.Addr, bool) {
	rest, ok := strings.CutSuffix(strings.ToLower(name), ".in-addr.arpa.")
	if !ok {
		return netip.Addr{}, false
	}
	parts := strings.Split(rest, ".")
	if len(parts) != 4 {
		return netip.Addr{}, false
	}
	for i, j := 0, 3; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	ip, err := netip.ParseAddr(strings.Join(parts, "."))
	return ip, err == nil && ip.Is4()
}

// build encodes a response; one over maxLen goes without its records and
// with TC set.
func build(h dnsmessage.Header, qs []dnsmessage.Question, rrs []dnsmessage.Resource, maxLen int) ([]byte, bool) {
	out, err := encode(h, qs, rrs)
	if err == nil && len(out) > maxLen {
		h.Truncated = true
		out, err = encode(h, qs, nil)
	}
	return out, err == nil
}

func encode(h dnsmessage.Header, qs []dnsmessage.Question, rrs []dnsmessage.Resource) ([]byte, error) {
	m := dnsmessage.Message{Header: h, Questions: qs, Answers: rrs}
	return m.Pack()
}
