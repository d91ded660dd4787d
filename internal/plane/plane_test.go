package plane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

// Ports the fake guest serves.
const (
	portEcho   = 1 // echoes until the host half-closes
	portFlood  = 2 // writes 4 MiB, then closes
	portSilent = 3 // accepts and says nothing
)

// rig is a Planes over a real channel whose guest half is a fake agent.
type rig struct {
	p           *Planes
	host, guest *channel.Mux
	in, out     atomic.Int64
	dir         string
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	r := &rig{dir: t.TempDir()}
	r.host, r.guest = channel.New(channel.Host, discard()), channel.New(channel.Guest, discard())
	hc, gc := net.Pipe()
	r.host.Attach(hc, false)
	r.guest.Attach(gc, false)
	go r.fakeAgent()
	if cfg.AppPort == 0 {
		cfg.AppPort = portEcho
	}
	if cfg.DataSocket == "" {
		cfg.DataSocket = filepath.Join(r.dir, "data.sock")
	}
	cfg.Connect = func(ctx context.Context, port uint16) (*channel.Stream, error) {
		return r.host.Open(agentproto.Request{Op: agentproto.OpConnect, Port: port}.Encode())
	}
	cfg.In = func(n int) { r.in.Add(int64(n)) }
	cfg.Out = func(n int) { r.out.Add(int64(n)) }
	cfg.Log = discard()
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.p = p
	go p.Serve()
	t.Cleanup(func() {
		p.Close()
		r.host.Close()
		r.guest.Close()
		hc.Close()
		gc.Close()
	})
	return r
}

func (r *rig) fakeAgent() {
	for {
		s, err := r.guest.Accept(context.Background())
		if err != nil {
			return
		}
		req, _ := agentproto.Decode(s.Meta())
		go func() {
			switch req.Port {
			case portEcho:
				io.Copy(s, s)
				s.CloseWrite(nil)
			case portFlood:
				s.Write(make([]byte, 4<<20))
				s.CloseWrite(nil)
			case portSilent:
				io.Copy(io.Discard, s)
			}
		}()
	}
}

func (r *rig) dial(t *testing.T) *net.UnixConn {
	t.Helper()
	c, err := net.Dial("unix", r.p.cfg.DataSocket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c.(*net.UnixConn)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestDataRoundTrip(t *testing.T) {
	r := newRig(t, Config{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := r.dial(t)
			msg := bytes.Repeat([]byte{byte('a' + i)}, 100_000)
			go func() { c.Write(msg); c.CloseWrite() }()
			got, err := io.ReadAll(c)
			if err != nil || !bytes.Equal(got, msg) {
				t.Errorf("conn %d: read %d bytes, %v", i, len(got), err)
			}
		}()
	}
	wg.Wait()
	waitFor(t, "the counters", func() bool {
		s := r.p.Stats()
		return s.Conns == 8 && s.Active == 0 && r.in.Load() == 800_000 && r.out.Load() == 800_000
	})
}

// TestDataCap: past max_data_conns a connection is closed at once and
// counted; a slot freed is usable again.
func TestDataCap(t *testing.T) {
	r := newRig(t, Config{MaxConns: 2, AppPort: portSilent})
	a, b := r.dial(t), r.dial(t)
	waitFor(t, "two connections bridged", func() bool { return r.p.Stats().Active == 2 })
	c := r.dial(t)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("the connection over the cap read %d, %v; want it closed at once", n, err)
	}
	if s := r.p.Stats(); s.Refused != 1 {
		t.Fatalf("refused %d, want 1", s.Refused)
	}
	a.Close()
	waitFor(t, "a slot freed", func() bool { return r.p.Stats().Active == 1 })
	_ = b
	r.dial(t)
	waitFor(t, "the freed slot reused", func() bool { return r.p.Stats().Active == 2 })
}

func TestMaxConnsCeiling(t *testing.T) {
	for _, n := range []int{0, -1, 49, 1000} {
		r := newRig(t, Config{MaxConns: n})
		if r.p.cfg.MaxConns != MaxConns {
			t.Errorf("max_data_conns %d became %d, want the ceiling %d", n, r.p.cfg.MaxConns, MaxConns)
		}
	}
}

func TestDataIdleReaped(t *testing.T) {
	r := newRig(t, Config{IdleMS: 100, AppPort: portSilent})
	c := r.dial(t)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	_, err := c.Read(make([]byte, 1))
	if !errors.Is(err, io.EOF) {
		t.Fatalf("read %v, want the reaped connection closed", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("reaped after %v, before data_idle_ms", d)
	}
	if s := r.p.Stats(); s.Reaped != 1 {
		t.Fatalf("reaped %d, want 1", s.Reaped)
	}
}

// TestDataRate: the guest's 4 MiB under a 16000 kbps cap take at least
// most of the ideal 2.1 s and arrive whole.
func TestDataRate(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 2 s")
	}
	r := newRig(t, Config{RateKbps: 16000, AppPort: portFlood})
	c := r.dial(t)
	start := time.Now()
	n, err := io.Copy(io.Discard, c)
	d := time.Since(start)
	ideal := time.Duration(float64(4<<20*8) / 16000e3 * float64(time.Second))
	t.Logf("4 MiB at 16000 kbps in %v (ideal %v)", d, ideal)
	if err != nil || n != 4<<20 {
		t.Fatalf("read %d bytes, %v", n, err)
	}
	if d < ideal*3/4 {
		t.Fatalf("took %v under a cap whose ideal is %v: not paced", d, ideal)
	}
}

// TestDrainGate: a platform that stops reading leaves bytes held on the
// host side, and Drained names the connection; a wedged platform does
// not stall another connection.
func TestDrainGate(t *testing.T) {
	r := newRig(t, Config{AppPort: portFlood})
	r.dial(t) // never read
	waitFor(t, "bytes held for the wedged platform", func() bool { return r.p.Drained() != nil })
	if err := r.p.Drained(); !strings.Contains(err.Error(), "data connection 1 holds") {
		t.Fatalf("Drained: %v", err)
	}
	// Another connection still flows.
	c := r.dial(t)
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != 4<<20 {
		t.Fatalf("the second connection read %d, %v", n, err)
	}
}

func TestDataSocketIsAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data.sock")
	os.WriteFile(path, []byte("x"), 0o600)
	_, err := New(Config{AppPort: 1, DataSocket: path, Connect: func(context.Context, uint16) (*channel.Stream, error) { return nil, nil }})
	if err == nil || !strings.Contains(err.Error(), "data_socket") || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("New: %v", err)
	}
}

// egressRig is a platform's egress listener.
type egressRig struct {
	ln    *net.UnixListener
	conns chan *net.UnixConn
}

func newEgress(t *testing.T, dir string) *egressRig {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, "egress.sock"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	e := &egressRig{ln: ln, conns: make(chan *net.UnixConn, 8)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			e.conns <- c
		}
	}()
	return e
}

// guestEgress opens an egress stream as the agent does and hands it to
// the planes as the session's dispatcher does.
func (r *rig) guestEgress(t *testing.T, id string, resume bool) *channel.Stream {
	t.Helper()
	gs, err := r.guest.Open(agentproto.Request{Op: agentproto.OpEgress, Conn: id}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs, err := r.host.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req, err := agentproto.Decode(hs.Meta())
	if err != nil {
		t.Fatal(err)
	}
	r.p.Egress(hs, req, resume)
	return gs
}

func TestEgress(t *testing.T) {
	dir := t.TempDir()
	e := newEgress(t, dir)
	r := newRig(t, Config{EgressSocket: filepath.Join(dir, "egress.sock"), IdleMS: 50,
		BootID: func() string { return "01BOOT" }})
	for _, resume := range []bool{false, true} {
		gs := r.guestEgress(t, "0123456789abcdef", resume)
		pc := <-e.conns
		br := bufio.NewReader(pc)
		line, err := br.ReadString('\n')
		want := fmt.Sprintf("NETHER-EGRESS v1 conn=0123456789abcdef resume=%d boot=01BOOT\n", map[bool]int{false: 0, true: 1}[resume])
		if err != nil || line != want || line != Preamble("0123456789abcdef", resume, "01BOOT") {
			t.Fatalf("preamble %q, %v", line, err)
		}
		gs.Write([]byte("GET /slow\n"))
		got, _ := br.ReadString('\n')
		if got != "GET /slow\n" {
			t.Fatalf("the platform read %q", got)
		}
		// Exempt from data_idle_ms: an upstream may be slow.
		time.Sleep(200 * time.Millisecond)
		pc.Write([]byte("200 OK\n"))
		pc.CloseWrite()
		reply, err := io.ReadAll(gs)
		if err != nil || string(reply) != "200 OK\n" {
			t.Fatalf("the tenant read %q, %v", reply, err)
		}
		gs.CloseWrite(nil)
		pc.Close()
	}
	if s := r.p.Stats(); s.Reaped != 0 {
		t.Fatalf("an egress connection was reaped for idleness")
	}
}

func TestEgressRefusals(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no egress socket configured", Config{}, "egress plane is off"},
		{"nobody listening", Config{EgressSocket: filepath.Join(dir, "absent.sock")}, "egress socket"},
		{"served by another uid", Config{EgressSocket: filepath.Join(dir, "egress.sock"), uid: 54321}, "not by nether's uid"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cfg.uid != 0 {
				newEgress(t, dir)
			}
			r := newRig(t, tc.cfg)
			gs := r.guestEgress(t, "00000000000000ff", false)
			_, err := io.ReadAll(gs)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("the tenant's stream ended with %v, want a reset naming %q", err, tc.want)
			}
			if s := r.p.Stats(); s.EgressFailed != 1 {
				t.Fatalf("egress failures %d, want 1", s.EgressFailed)
			}
		})
	}
}

// Without a boot id the preamble is v1's first form, field for field.
func TestPreambleWithoutBoot(t *testing.T) {
	if got := Preamble("0123456789abcdef", true, ""); got != "NETHER-EGRESS v1 conn=0123456789abcdef resume=1\n" {
		t.Fatalf("Preamble = %q", got)
	}
}
