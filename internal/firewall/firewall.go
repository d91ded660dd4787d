// Package firewall decides which destinations a sandbox's guest may
// connect to. The default is deny-private: public addresses are allowed;
// loopback, the private and shared ranges, link-local (the cloud metadata
// address 169.254.169.254 among them), "this network", multicast,
// broadcast and reserved space are blocked unless allowed. The decision is
// made on the address actually connected to, never on a name.
package firewall

import (
	"fmt"
	"net/netip"
	"strings"
)

// Rules are a sandbox's firewall, from nether.conf.
type Rules struct {
	// Open turns the default deny off (net_open = 1): everything is
	// allowed but Block.
	Open bool
	// Allow are exceptions to the default deny (net_allow).
	Allow []netip.Prefix
	// Block are blocked whatever else says (net_block), public
	// addresses and Allow included.
	Block []netip.Prefix
}

// DefaultDeny is what the default blocks: every address that is not a
// public unicast destination. IPv6 entries are there for when a guest
// gets IPv6 (ours do not today); IPv4-mapped IPv6 addresses are decided
// as the IPv4 address they map.
var DefaultDeny = mustPrefixes(
	"0.0.0.0/8",      // "this network"
	"10.0.0.0/8",     // private (the guest's own 10.0.2.0/24 included)
	"100.64.0.0/10",  // carrier-grade NAT, shared address space
	"127.0.0.0/8",    // loopback
	"169.254.0.0/16", // link-local: the cloud metadata service
	"172.16.0.0/12",  // private
	"192.0.0.0/24",   // IETF protocol assignments
	"192.168.0.0/16", // private
	"198.18.0.0/15",  // benchmarking: inside somebody's lab
	"224.0.0.0/4",    // multicast
	"240.0.0.0/4",    // reserved, and the broadcast address
	"::/128",         // unspecified
	"::1/128",        // loopback
	"fc00::/7",       // unique local
	"fe80::/10",      // link-local
	"ff00::/8",       // multicast
	"64:ff9b:1::/48", // local-use NAT64
)

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// Decision is why an address is allowed or blocked.
type Decision struct {
	Allow bool
	// Rule names what decided: "net_block 1.2.3.0/24",
	// "net_allow 10.0.2.2/32", "private 10.0.0.0/8", "net_open",
	// "public".
	Rule string
}

// Decide applies the rules to ip: net_block first (it wins over
// everything), then net_open, then net_allow, then the default deny;
// anything left is public and allowed.
func (r Rules) Decide(ip netip.Addr) Decision {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return Decision{Allow: false, Rule: "invalid address"}
	}
	if p, ok := match(r.Block, ip); ok {
		return Decision{Allow: false, Rule: "net_block " + p.String()}
	}
	if r.Open {
		return Decision{Allow: true, Rule: "net_open"}
	}
	if p, ok := match(r.Allow, ip); ok {
		return Decision{Allow: true, Rule: "net_allow " + p.String()}
	}
	if p, ok := match(DefaultDeny, ip); ok {
		return Decision{Allow: false, Rule: "private " + p.String()}
	}
	if ip.Is6() && !ip.IsGlobalUnicast() {
		return Decision{Allow: false, Rule: "not global unicast"}
	}
	return Decision{Allow: true, Rule: "public"}
}

// Allows reports whether ip may be connected to.
func (r Rules) Allows(ip netip.Addr) bool { return r.Decide(ip).Allow }

// match finds the prefix of ps that contains ip, comparing IPv4-mapped
// prefixes as IPv4 too.
func match(ps []netip.Prefix, ip netip.Addr) (netip.Prefix, bool) {
	for _, p := range ps {
		if p.Contains(ip) {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

// ParseList parses a comma-separated list of CIDR prefixes, as net_allow
// and net_block take them: "10.0.0.0/8, 192.168.0.0/16". Blanks around
// items are ignored; a bare address is a single host (/32 or /128); a
// prefix with host bits set ("10.0.0.1/8") is refused, since it is
// probably not what was meant; an IPv4-mapped IPv6 prefix is taken as the
// IPv4 prefix it maps.
func ParseList(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return nil, fmt.Errorf("item %d is empty", i+1)
		}
		p, err := parseItem(item)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func parseItem(item string) (netip.Prefix, error) {
	if !strings.Contains(item, "/") {
		a, err := netip.ParseAddr(item)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix or an address", item)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(item)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR prefix", item)
	}
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%q has bits set past its /%d (did you mean %s?)", item, p.Bits(), p.Masked())
	}
	if a := p.Addr(); a.Is4In6() {
		// Masked, so at least /96: the mapped range is ::ffff:0:0/96.
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, nil
}

// FormatList renders a list as ParseList reads it.
func FormatList(ps []netip.Prefix) string {
	ss := make([]string, len(ps))
	for i, p := range ps {
		ss[i] = p.String()
	}
	return strings.Join(ss, ", ")
}
