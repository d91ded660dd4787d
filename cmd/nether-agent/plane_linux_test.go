package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// tenantEcho is a loopback server that answers each line with "echo: "
// and the line, as a tenant's ordinary server would.
func tenantEcho(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					io.WriteString(c, "echo: "+sc.Text()+"\n")
				}
			}()
		}
	}()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

func TestConnect(t *testing.T) {
	ta := startAgent(t)
	port := tenantEcho(t)
	t.Run("reaches the tenant and passes a half-close on", func(t *testing.T) {
		s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpConnect, Port: port}.Encode())
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(s, "one\ntwo\n")
		s.CloseWrite(nil)
		got, err := io.ReadAll(s)
		if err != nil || string(got) != "echo: one\necho: two\n" {
			t.Fatalf("read %q, %v", got, err)
		}
	})
	t.Run("nothing listening is a reset naming the connect", func(t *testing.T) {
		s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpConnect, Port: freePort(t)}.Encode())
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(s)
		if err == nil || !strings.Contains(err.Error(), "connecting to the tenant's server") {
			t.Fatalf("read error %v, want a reset naming the connect", err)
		}
	})
	ta.waitServed(t)
}

// freePort is a loopback port nothing listens on.
func freePort(t *testing.T) uint16 {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return uint16(l.Addr().(*net.TCPAddr).Port)
}

// setListener asks the agent for its egress listener on port, as the
// host does.
func (ta *testAgent) setListener(t *testing.T, port uint16) {
	t.Helper()
	s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpListen, Port: port}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(s); err != nil {
		t.Fatalf("listen %d: %v", port, err)
	}
}

// tenantConnects opens a tenant connection to the egress port and
// returns it with the egress stream the host accepted for it.
func (ta *testAgent) tenantConnects(t *testing.T, port uint16) (net.Conn, *channel.Stream) {
	t.Helper()
	tenant, err := net.Dial("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tenant.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := ta.host.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return tenant, s
}

// TestEgress: a tenant's connection to the egress port becomes a stream
// the host accepts, with a well-formed conn id; bytes pass both ways; the
// listener moves and closes on request.
func TestEgress(t *testing.T) {
	ta := startAgent(t)
	port := freePort(t)
	ta.setListener(t, port)
	ta.setListener(t, port) // idempotent
	tenant, s := ta.tenantConnects(t, port)
	req, err := agentproto.Decode(s.Meta())
	if err != nil || req.Op != agentproto.OpEgress || !agentproto.ValidConn(req.Conn) {
		t.Fatalf("egress stream meta %+v, %v", req, err)
	}
	io.WriteString(tenant, "GET /\n")
	buf := make([]byte, 6)
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "GET /\n" {
		t.Fatalf("host read %q, %v", buf, err)
	}
	io.WriteString(s, "200 OK\n")
	s.CloseWrite(nil)
	got, err := io.ReadAll(tenant)
	if err != nil || string(got) != "200 OK\n" {
		t.Fatalf("tenant read %q, %v", got, err)
	}
	ta.setListener(t, 0)
	if c, err := net.DialTimeout("tcp4", net.JoinHostPort("127.0.0.1", itoa(port)), time.Second); err == nil {
		c.Close()
		t.Fatal("the egress listener still accepts after listen 0")
	}
}

// TestEgressHostRefuses: a host that resets the egress stream (no
// egress_socket, or it could not be dialled) closes the tenant's
// connection at once.
func TestEgressHostRefuses(t *testing.T) {
	ta := startAgent(t)
	port := freePort(t)
	ta.setListener(t, port)
	tenant, es := ta.tenantConnects(t, port)
	es.Reset("no egress socket")
	tenant.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(tenant); err != nil && strings.Contains(err.Error(), "timeout") {
		t.Fatal("the tenant's connection was left open after the host refused it")
	}
}

func itoa(p uint16) string { return strconv.Itoa(int(p)) }
