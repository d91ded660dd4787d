package netstack

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// fakeDNS is a loopback nameserver: www.example.test is a CNAME of
// example.test, which has two A records; fail.test fails; every other
// name does not exist.
func fakeDNS(t testing.TB) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			k, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var m dnsmessage.Message
			if m.Unpack(buf[:k]) != nil || len(m.Questions) != 1 {
				continue
			}
			q := m.Questions[0]
			m.Response, m.RecursionAvailable = true, true
			hdr := func(n string, t dnsmessage.Type) dnsmessage.ResourceHeader {
				return dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName(n), Type: t, Class: dnsmessage.ClassINET, TTL: 60}
			}
			a := func(n string, ip ...byte) dnsmessage.Resource {
				return dnsmessage.Resource{Header: hdr(n, dnsmessage.TypeA), Body: &dnsmessage.AResource{A: [4]byte(ip)}}
			}
			switch name := q.Name.String(); {
			case name == "fail.test.":
				m.RCode = dnsmessage.RCodeServerFailure
			case name == "www.example.test." || name == "example.test.":
				if name == "www.example.test." {
					m.Answers = append(m.Answers, dnsmessage.Resource{Header: hdr(name, dnsmessage.TypeCNAME),
						Body: &dnsmessage.CNAMEResource{CNAME: dnsmessage.MustNewName("example.test.")}})
				}
				if q.Type == dnsmessage.TypeA {
					m.Answers = append(m.Answers, a("example.test.", 192, 0, 2, 1), a("example.test.", 192, 0, 2, 2))
				}
			default:
				m.RCode = dnsmessage.RCodeNameError
			}
			out, _ := m.Pack()
			pc.WriteTo(out, from)
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp4", pc.LocalAddr().String())
	}}
}

func query(name string, typ dnsmessage.Type) []byte {
	q, _ := (&dnsmessage.Message{Header: dnsmessage.Header{ID: 7, RecursionDesired: true},
		Questions: []dnsmessage.Question{{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}}}).Pack()
	return q
}

func TestDNS(t *testing.T) {
	r := newRig(t, Config{Resolver: fakeDNS(t)})
	for _, tc := range []struct {
		name  string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		want  []string // the answers, in order
	}{
		{"example.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"A 192.0.2.1", "A 192.0.2.2"}},
		{"www.example.test.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"CNAME example.test.", "A 192.0.2.1", "A 192.0.2.2"}},
		{"example.test.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil},
		{"nope.test.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil},
		{"fail.test.", dnsmessage.TypeA, dnsmessage.RCodeServerFailure, nil},
		{"example.test.", dnsmessage.TypeMX, dnsmessage.RCodeNotImplemented, nil},
	} {
		for _, transport := range []string{"udp", "tcp"} {
			t.Run(transport+" "+tc.typ.String()+" "+tc.name, func(t *testing.T) {
				var resp []byte
				if transport == "udp" {
					c := r.g.dialUDP(t, netip.AddrPortFrom(DNSAddr, 53))
					c.SetDeadline(time.Now().Add(5 * time.Second))
					c.Write(query(tc.name, tc.typ))
					buf := make([]byte, 1500)
					k, err := c.Read(buf)
					if err != nil {
						t.Fatal(err)
					}
					resp = buf[:k]
				} else {
					resp = queryTCP(t, r.g, query(tc.name, tc.typ))
				}
				var m dnsmessage.Message
				if err := m.Unpack(resp); err != nil {
					t.Fatal(err)
				}
				if m.ID != 7 || !m.Response || m.RCode != tc.rcode {
					t.Fatalf("header %+v, want rcode %v", m.Header, tc.rcode)
				}
				var got []string
				for _, a := range m.Answers {
					switch b := a.Body.(type) {
					case *dnsmessage.AResource:
						got = append(got, "A "+netip.AddrFrom4(b.A).String())
					case *dnsmessage.CNAMEResource:
						got = append(got, "CNAME "+b.CNAME.String())
					}
				}
				if len(got) != len(tc.want) {
					t.Fatalf("answers %q, want %q", got, tc.want)
				}
				for i := range got {
					if got[i] != tc.want[i] {
						t.Fatalf("answers %q, want %q", got, tc.want)
					}
				}
			})
		}
	}
	if s := r.n.Stats(); s.Flows != 0 || s.Blocked != 0 {
		t.Fatalf("DNS counted as flows: %+v", s)
	}
}

func queryTCP(t *testing.T, g *guest, q []byte) []byte {
	t.Helper()
	c, err := g.dial(ctxT(t, 5*time.Second), netip.AddrPortFrom(DNSAddr, 53))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(q))))
	c.Write(q)
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		t.Fatal(err)
	}
	resp := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, resp); err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestDNSFlood: queries past the rate bound are dropped and counted, not
// queued.
func TestDNSFlood(t *testing.T) {
	r := newRig(t, Config{Resolver: fakeDNS(t)})
	c := r.g.dialUDP(t, netip.AddrPortFrom(DNSAddr, 53))
	const sent = 400
	for i := 0; i < sent; i++ {
		c.Write(query("example.test.", dnsmessage.TypeA))
	}
	answered := 0
	buf := make([]byte, 1500)
	for {
		c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Read(buf); err != nil {
			break
		}
		answered++
	}
	s := r.n.Stats()
	t.Logf("%d queries at once: %d answered, %d dropped", sent, answered, s.DNSDropped)
	if s.DNSDropped == 0 || answered == 0 || answered+int(s.DNSDropped) > sent {
		t.Fatalf("answered %d, dropped %d of %d", answered, s.DNSDropped, sent)
	}
}
