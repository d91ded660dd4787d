package firewall

import (
	"net/netip"
	"strings"
	"testing"
)

func TestDecide(t *testing.T) {
	def := Rules{}
	allowGW := Rules{Allow: mustPrefixes("10.0.2.2/32")}
	allowPriv := Rules{Allow: mustPrefixes("10.0.0.0/8", "192.168.0.0/16")}
	blockPub := Rules{Block: mustPrefixes("203.0.113.0/24"), Allow: mustPrefixes("203.0.113.7/32")}
	open := Rules{Open: true}
	openBlock := Rules{Open: true, Block: mustPrefixes("169.254.169.254/32")}
	for _, tc := range []struct {
		name  string
		rules Rules
		ip    string
		allow bool
		rule  string
	}{
		{"public", def, "203.0.113.2", true, "public"},
		{"public 8.8.8.8", def, "8.8.8.8", true, "public"},
		{"metadata", def, "169.254.169.254", false, "private 169.254.0.0/16"},
		{"loopback", def, "127.0.0.1", false, "private 127.0.0.0/8"},
		{"loopback far", def, "127.255.0.9", false, "private 127.0.0.0/8"},
		{"gateway", def, "10.0.2.2", false, "private 10.0.0.0/8"},
		{"dns addr", def, "10.0.2.3", false, "private 10.0.0.0/8"},
		{"172.16", def, "172.16.0.1", false, "private 172.16.0.0/12"},
		{"172.31", def, "172.31.255.255", false, "private 172.16.0.0/12"},
		{"172.32 is public", def, "172.32.0.1", true, "public"},
		{"192.168", def, "192.168.1.10", false, "private 192.168.0.0/16"},
		{"cgnat", def, "100.64.0.1", false, "private 100.64.0.0/10"},
		{"this network", def, "0.0.0.0", false, "private 0.0.0.0/8"},
		{"multicast", def, "224.0.0.251", false, "private 224.0.0.0/4"},
		{"broadcast", def, "255.255.255.255", false, "private 240.0.0.0/4"},
		{"mapped loopback", def, "::ffff:127.0.0.1", false, "private 127.0.0.0/8"},
		{"mapped metadata", def, "::ffff:169.254.169.254", false, "private 169.254.0.0/16"},
		{"mapped public", def, "::ffff:203.0.113.2", true, "public"},
		{"v6 loopback", def, "::1", false, "private ::1/128"},
		{"v6 ula", def, "fd00::1", false, "private fc00::/7"},
		{"v6 link-local", def, "fe80::1", false, "private fe80::/10"},
		{"v6 public", def, "2001:db8::1", true, "public"},
		{"allowed gateway", allowGW, "10.0.2.2", true, "net_allow 10.0.2.2/32"},
		{"allow is exact", allowGW, "10.0.2.3", false, "private 10.0.0.0/8"},
		{"allow list", allowPriv, "192.168.7.7", true, "net_allow 192.168.0.0/16"},
		{"allow list keeps metadata blocked", allowPriv, "169.254.169.254", false, "private 169.254.0.0/16"},
		{"block public", blockPub, "203.0.113.2", false, "net_block 203.0.113.0/24"},
		{"block wins over allow", blockPub, "203.0.113.7", false, "net_block 203.0.113.0/24"},
		{"open", open, "169.254.169.254", true, "net_open"},
		{"open private", open, "10.1.2.3", true, "net_open"},
		{"block wins over open", openBlock, "169.254.169.254", false, "net_block 169.254.169.254/32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.rules.Decide(netip.MustParseAddr(tc.ip))
			if d.Allow != tc.allow || d.Rule != tc.rule {
				t.Fatalf("Decide(%s) = %+v, want allow=%v rule=%q", tc.ip, d, tc.allow, tc.rule)
			}
		})
	}
	if (Rules{}).Allows(netip.Addr{}) {
		t.Error("the zero address is allowed")
	}
}

func TestParseList(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "10.0.0.0/8, 192.168.0.0/16", want: "10.0.0.0/8, 192.168.0.0/16"},
		{in: "10.0.0.0/8,192.168.0.0/16", want: "10.0.0.0/8, 192.168.0.0/16"},
		{in: "  1.2.3.0/24  ", want: "1.2.3.0/24"},
		{in: "10.0.2.2", want: "10.0.2.2/32"},
		{in: "2001:db8::/32, ::1", want: "2001:db8::/32, ::1/128"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},
		{in: "::ffff:10.0.2.2", want: "10.0.2.2/32"},
		{in: "10.0.0.1/8", err: `"10.0.0.1/8" has bits set past its /8 (did you mean 10.0.0.0/8?)`},
		{in: "10.0.0.0/33", err: `"10.0.0.0/33" is not a CIDR prefix`},
		{in: "10.0.0.0/8,", err: "item 2 is empty"},
		{in: "", err: "item 1 is empty"},
		{in: "example.com", err: `"example.com" is not a CIDR prefix or an address`},
		{in: "10.0.0.0/8 192.168.0.0/16", err: `"10.0.0.0/8 192.168.0.0/16" is not a CIDR prefix`},
		{in: "fe80::1%eth0", err: `"fe80::1%eth0" is not a CIDR prefix or an address`},
		{in: "::ffff:0:0/90", err: `"::ffff:0:0/90" has bits set past its /90 (did you mean ::ffc0:0:0/90?)`},
		{in: "::ffff:0:0/96", want: "0.0.0.0/0"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseList(tc.in)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("ParseList(%q) = %v, %v; want error %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || FormatList(got) != tc.want {
				t.Fatalf("ParseList(%q) = %q, %v; want %q", tc.in, FormatList(got), err, tc.want)
			}
		})
	}
}

func FuzzParseList(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8, 192.168.0.0/16", "10.0.2.2", "::ffff:10.0.0.0/104", "1.2.3.4/33", ",,", "fe80::1%x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ps, err := ParseList(s)
		if err != nil {
			return
		}
		// What parses renders back to something that parses to the same.
		again, err := ParseList(FormatList(ps))
		if err != nil || FormatList(again) != FormatList(ps) {
			t.Fatalf("ParseList(%q) = %q, which reparses as %q, %v", s, FormatList(ps), FormatList(again), err)
		}
		for _, p := range ps {
			if p.Masked() != p || p.Addr().Is4In6() {
				t.Fatalf("ParseList(%q) kept %s", s, p)
			}
			if strings.ContainsAny(p.String(), " ,") {
				t.Fatalf("prefix %q", p)
			}
		}
	})
}
