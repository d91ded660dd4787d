package netlog

import (
	"net/netip"
	"testing"
)

func TestReply(t *testing.T) {
	l := New(2)
	if got := string(l.Reply()); got != "NETLOG 0\n" {
		t.Fatalf("empty: %q", got)
	}
	l.Add(Entry{MS: 5, Proto: "TCP", Dst: netip.MustParseAddrPort("203.0.113.2:80"), Allowed: true})
	l.Add(Entry{MS: 9, Proto: "UDP", Dst: netip.MustParseAddrPort("169.254.169.254:53")})
	want := "NETLOG 2\n5 TCP 203.0.113.2:80 ALLOW\n9 UDP 169.254.169.254:53 BLOCK\n"
	if got := string(l.Reply()); got != want {
		t.Fatalf("Reply() = %q, want %q", got, want)
	}
	l.Add(Entry{MS: 12, Proto: "TCP", Dst: netip.MustParseAddrPort("10.0.2.2:22")})
	want = "NETLOG 2 dropped=1\n9 UDP 169.254.169.254:53 BLOCK\n12 TCP 10.0.2.2:22 BLOCK\n"
	if got := string(l.Reply()); got != want {
		t.Fatalf("after a wrap: %q, want %q", got, want)
	}
}

func TestNilLogIsOff(t *testing.T) {
	var l *Log
	l.Add(Entry{})
}
