package main

import (
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
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testReaper is shared by every test: a reaper waits for any child
// (wait4(-1)), so two in one process would steal each other's statuses.
var testReaper = sync.OnceValue(func() *reaper {
	r := newReaper()
	go r.run()
	return r
})

// testAgent is an agent served over an in-memory channel, as main serves
// one over the virtio-serial port. powerOffs counts poweroff requests that
// got past the agent's checks.
type testAgent struct {
	a         *agent
	host      *channel.Mux
	powerOffs chan struct{}
}

func startAgent(t *testing.T) *testAgent {
	t.Helper()
	host, guest := channel.New(channel.Host, quietLog()), channel.New(channel.Guest, quietLog())
	hc, gc := net.Pipe()
	host.Attach(hc, false)
	guest.Attach(gc, false)
	ta := &testAgent{host: host, powerOffs: make(chan struct{}, 8)}
	ta.a = newAgent(quietLog(), testReaper(), guest, func() { ta.powerOffs <- struct{}{} })
	ctx, cancel := context.WithCancel(context.Background())
	go ta.a.run(ctx)
	t.Cleanup(func() {
		cancel()
		host.Close()
		guest.Close()
		hc.Close()
		gc.Close()
	})
	return ta
}

// waitServed waits until every request the agent accepted is done with:
// its serve call returned, so whatever it opened should be closed.
func (ta *testAgent) waitServed(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for ta.a.serving.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d request(s) still being served 5s after their streams ended", ta.a.serving.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// result is what the host saw of one request.
type result struct {
	out    string
	status string
	err    error // the agent's Reset, or a transport failure
}

// do sends req as the host does (sandbox.Exec/Put/Get): put streams body
// and closes with its length; every other operation closes at once.
func (ta *testAgent) do(t *testing.T, req agentproto.Request, body string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := ta.host.Open(req.Encode())
	if err != nil {
		t.Fatalf("opening %s stream: %v", req.Op, err)
	}
	var status []byte
	if req.Op == agentproto.OpPut {
		if _, err := s.WriteContext(ctx, []byte(body)); err != nil {
			return result{err: err}
		}
		status = []byte(fmt.Sprint(len(body)))
	}
	if err := s.CloseWrite(status); err != nil {
		return result{err: err}
	}
	out, err := readAll(ctx, s)
	return result{out: string(out), status: string(s.Status()), err: err}
}

func readAll(ctx context.Context, s *channel.Stream) ([]byte, error) {
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := s.ReadContext(ctx, buf)
		out = append(out, buf[:n]...)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// restore runs the real post-restore handshake, which is how the agent's
// epoch changes.
func (ta *testAgent) restore(t *testing.T, epoch uint64) {
	t.Helper()
	r := ta.do(t, agentproto.Request{Op: agentproto.OpRestored, Epoch: epoch}, "")
	if want := fmt.Sprintf("ok %d", epoch); r.err != nil || r.status != want {
		t.Fatalf("restore handshake to epoch %d: status %q, err %v; want %q", epoch, r.status, r.err, want)
	}
	if got := ta.a.epoch.Load(); got != epoch {
		t.Fatalf("agent serves epoch %d after the handshake, want %d", got, epoch)
	}
}

// TestServeEpoch drives every host request through serve, on a fresh guest
// and after restore handshakes, and checks a stale one runs nothing.
func TestServeEpoch(t *testing.T) {
	const newEpoch = 0x5eed5eed5eed5eed
	type env struct {
		dir   string
		ta    *testAgent
		marks string // a file only a request that ran would create
	}
	tests := []struct {
		name     string
		restores []uint64 // handshakes before the request
		req      func(t *testing.T, e env) agentproto.Request
		body     string
		// wantReset is the agent's refusal; "" means the request is
		// served and check (if any) looks at what it did.
		wantReset string
		check     func(t *testing.T, e env, r result)
	}{
		{
			name:     "exec from before the restore",
			restores: []uint64{9},
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpExec, Command: agentproto.Text("touch " + e.marks)}
			},
			wantReset: "stale session epoch 0 (agent serves 9)",
		},
		{
			name: "exec stamped with an epoch on a fresh guest",
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpExec, Command: agentproto.Text("touch " + e.marks), Epoch: 5}
			},
			wantReset: "stale session epoch 5 (agent serves 0)",
		},
		{
			name:     "exec from the session before the last restore",
			restores: []uint64{5, 9},
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpExec, Command: agentproto.Text("touch " + e.marks), Epoch: 5}
			},
			wantReset: "stale session epoch 5 (agent serves 9)",
		},
		{
			name:     "put from before the restore",
			restores: []uint64{newEpoch},
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(e.marks)}
			},
			body:      "stale",
			wantReset: fmt.Sprintf("stale session epoch 0 (agent serves %d)", uint64(newEpoch)),
		},
		{
			name: "put on a fresh guest",
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(e.marks)}
			},
			body: "hello",
			check: func(t *testing.T, e env, r result) {
				wantFile(t, e.marks, "hello")
			},
		},
		{
			name:     "put after the restore",
			restores: []uint64{newEpoch},
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(e.marks), Epoch: newEpoch}
			},
			body: "fresh",
			check: func(t *testing.T, e env, r result) {
				if r.status != "ok 5" {
					t.Errorf("put status %q, want ok 5", r.status)
				}
				wantFile(t, e.marks, "fresh")
			},
		},
		{
			name:     "get from before the restore",
			restores: []uint64{9},
			req: func(t *testing.T, e env) agentproto.Request {
				writeFile(t, e.marks, "secret")
				return agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(e.marks)}
			},
			wantReset: "stale session epoch 0 (agent serves 9)",
		},
		{
			name:     "get after the restore",
			restores: []uint64{9},
			req: func(t *testing.T, e env) agentproto.Request {
				writeFile(t, e.marks, "data")
				return agentproto.Request{Op: agentproto.OpGet, Path: agentproto.Text(e.marks), Epoch: 9}
			},
			check: func(t *testing.T, e env, r result) {
				if r.out != "data" || r.status != "ok 4" {
					t.Errorf("get returned %q with status %q, want data / ok 4", r.out, r.status)
				}
			},
		},
		{
			name:      "poweroff from before the restore",
			restores:  []uint64{9},
			req:       func(t *testing.T, e env) agentproto.Request { return agentproto.Request{Op: agentproto.OpPoweroff} },
			wantReset: "stale session epoch 0 (agent serves 9)",
		},
		{
			name:     "poweroff after the restore",
			restores: []uint64{9},
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpPoweroff, Epoch: 9}
			},
			check: func(t *testing.T, e env, r result) {
				select {
				case <-e.ta.powerOffs:
				case <-time.After(5 * time.Second):
					t.Error("acknowledged poweroff did not power off")
				}
			},
		},
		{
			name:     "handshake back to a fresh epoch",
			restores: []uint64{9, 0},
			req: func(t *testing.T, e env) agentproto.Request {
				return agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(e.marks)}
			},
			body: "zero",
			check: func(t *testing.T, e env, r result) {
				wantFile(t, e.marks, "zero")
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			e := env{dir: dir, ta: startAgent(t), marks: filepath.Join(dir, "mark")}
			for _, ep := range tt.restores {
				e.ta.restore(t, ep)
			}
			req := tt.req(t, e)
			before := entries(t, dir)
			r := e.ta.do(t, req, tt.body)
			if tt.wantReset == "" {
				if r.err != nil {
					t.Fatalf("%s refused: %v", req.Op, r.err)
				}
				if tt.check != nil {
					tt.check(t, e, r)
				}
				return
			}
			if !errors.Is(r.err, channel.ErrReset) || !strings.HasSuffix(r.err.Error(), ": "+tt.wantReset) {
				t.Fatalf("%s: out %q, status %q, err %v; want a reset with %q", req.Op, r.out, r.status, r.err, tt.wantReset)
			}
			if r.out != "" {
				t.Errorf("refused %s sent %q", req.Op, r.out)
			}
			// Nothing ran: no marker, no temporary file, no power-off.
			// A refused stream gets no CloseWrite, and poweroff would
			// come after it, so a short wait covers a late one.
			time.Sleep(50 * time.Millisecond)
			if after := entries(t, dir); after != before {
				t.Errorf("refused %s changed %s: %s -> %s", req.Op, dir, before, after)
			}
			if n := len(e.ta.powerOffs); n != 0 {
				t.Errorf("refused %s powered off %d time(s)", req.Op, n)
			}
		})
	}
}

// TestServeEpochChangeMidStream checks that a stream admitted before a
// restore handshake finishes under the old epoch, while a new request
// from the old session is refused.
func TestServeEpochChangeMidStream(t *testing.T) {
	ta := startAgent(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "f")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// The agent creates its temporary file only after the epoch check, so
	// once it exists the stream has been admitted under epoch 0.
	s := startPut(ctx, t, ta, target, "first half, ")
	ta.restore(t, 9)

	if _, err := s.WriteContext(ctx, []byte("second half")); err != nil {
		t.Fatalf("admitted put cut off by the epoch change: %v", err)
	}
	const body = "first half, second half"
	if err := s.CloseWrite([]byte(fmt.Sprint(len(body)))); err != nil {
		t.Fatal(err)
	}
	if _, err := readAll(ctx, s); err != nil {
		t.Fatalf("admitted put failed after the epoch change: %v", err)
	}
	if got := string(s.Status()); got != fmt.Sprintf("ok %d", len(body)) {
		t.Fatalf("status %q", got)
	}
	wantFile(t, target, body)

	t.Run("a new request of the old session is refused", func(t *testing.T) {
		r := ta.do(t, agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(target)}, "late")
		if !errors.Is(r.err, channel.ErrReset) || !strings.Contains(r.err.Error(), "stale session epoch 0 (agent serves 9)") {
			t.Fatalf("late put: status %q, err %v; want the stale-epoch reset", r.status, r.err)
		}
		wantFile(t, target, body)
	})
}

func writeFile(t *testing.T, p, content string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantFile(t *testing.T, p, want string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("reading %s: %v", p, err)
	}
	if string(b) != want {
		t.Fatalf("%s holds %q, want %q", p, b, want)
	}
}

// entries lists a directory's names with sizes, to tell whether anything
// was created, removed or written there.
func entries(t *testing.T, dir string) string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, de := range des {
		fi, err := de.Info()
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s:%d ", de.Name(), fi.Size())
	}
	return "[" + strings.TrimSpace(b.String()) + "]"
}

// startPut opens a put of target, sends first, and returns once the agent
// has created its temporary file beside the target (the put is under way).
func startPut(ctx context.Context, t *testing.T, ta *testAgent, target, first string) *channel.Stream {
	t.Helper()
	s, err := ta.host.Open(agentproto.Request{Op: agentproto.OpPut, Path: agentproto.Text(target)}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteContext(ctx, []byte(first)); err != nil {
		t.Fatal(err)
	}
	for {
		if tmp, _ := filepath.Glob(filepath.Join(filepath.Dir(target), ".nether-put-*")); len(tmp) > 0 {
			return s
		}
		if ctx.Err() != nil {
			t.Fatal("the put never started")
		}
		time.Sleep(time.Millisecond)
	}
}
