package agentclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/agentproto"
	"github.com/nethersandbox/nether/internal/channel"
	"github.com/nethersandbox/nether/internal/engine"
	"github.com/nethersandbox/nether/internal/engine/fake"
)

// boot starts a fake guest and a client on its channel, serving.
func boot(t *testing.T, faults fake.Faults) (*Client, *fake.Machine) {
	t.Helper()
	eng := fake.New(slog.Default())
	eng.SetFaults(faults)
	m, err := eng.Start(context.Background(), engine.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	mux := channel.New(channel.Host, slog.Default())
	mux.Attach(m.Channel(), false)
	ctx, cancel := context.WithCancel(context.Background())
	c := New(slog.Default(), mux, 0)
	go c.Serve(ctx)
	t.Cleanup(func() {
		cancel()
		m.Quit(context.Background())
		mux.Close()
	})
	return c, m.(*fake.Machine)
}

func TestExecPutGet(t *testing.T) {
	c, m := boot(t, fake.Faults{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.WaitUp(ctx); err != nil {
		t.Fatalf("agent never came up: %v", err)
	}
	st, err := c.Exec(ctx, "echo hi")
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(st)
	if err != nil || string(out) != "hi\n" || string(st.Status()) != "0" {
		t.Fatalf("exec: %q status %q err %v", out, st.Status(), err)
	}
	if n, err := c.Put(ctx, strings.NewReader("data"), 0o644, "/f", 0); err != nil || n != 4 {
		t.Fatalf("put: %d %v", n, err)
	}
	if b, _ := m.File("/f"); string(b) != "data" {
		t.Fatalf("guest holds %q", b)
	}
	var got bytes.Buffer
	if n, err := c.Get(ctx, "/f", &got, 0); err != nil || n != 4 || got.String() != "data" {
		t.Fatalf("get: %d %q %v", n, got.String(), err)
	}
	_, err = c.Get(ctx, "/missing", io.Discard, 0)
	if err == nil || !strings.Contains(err.Error(), "no such file") || strings.Contains(err.Error(), channel.ErrReset.Error()) {
		t.Fatalf("get of a missing file: %v (want the agent's own message)", err)
	}
}

// TestHandshakeEpoch: the handshake sets a fresh non-zero epoch that every
// later request carries, and an agent that never answers cannot hold it
// beyond its context.
func TestHandshakeEpoch(t *testing.T) {
	c, m := boot(t, fake.Faults{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c.WaitUp(ctx)
	if _, err := c.Handshake(ctx, agentproto.Request{}); err != nil {
		t.Fatal(err)
	}
	first := m.Epoch()
	if first == 0 {
		t.Fatal("the agent still serves epoch 0")
	}
	st, err := c.Exec(ctx, "exit 0")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(st); err != nil {
		t.Fatalf("a request after the handshake was refused: %v", err)
	}
	if _, err := c.Handshake(ctx, agentproto.Request{}); err != nil || m.Epoch() == first {
		t.Fatalf("a second handshake: %v, epoch %d (was %d)", err, m.Epoch(), first)
	}

	hung, _ := boot(t, fake.Faults{HangHandshake: true})
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	start := time.Now()
	_, err = hung.Handshake(short, agentproto.Request{})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("a handshake the agent never answers: %v after %s", err, time.Since(start))
	}
}

// TestDispatcher: guest-opened streams go to the handler of their kind;
// a kind nobody handles is refused.
func TestDispatcher(t *testing.T) {
	host, guest := channel.New(channel.Host, slog.Default()), channel.New(channel.Guest, slog.Default())
	a, b := pipe()
	host.Attach(a, false)
	guest.Attach(b, true)
	defer host.Close()
	defer guest.Close()
	c := New(slog.Default(), host, 0)
	got := make(chan string, 1)
	c.Handle(agentproto.OpExec, func(ctx context.Context, st *channel.Stream, req agentproto.Request) {
		got <- string(req.Command)
		st.CloseWrite([]byte("handled"))
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Serve(ctx)

	cases := []struct {
		name       string
		meta       []byte
		wantStatus string
		wantReset  bool
	}{
		{"handled kind", agentproto.Request{Op: agentproto.OpExec, Command: "x"}.Encode(), "handled", false},
		{"unhandled kind", agentproto.Request{Op: agentproto.OpGet}.Encode(), "", true},
		{"garbage", []byte("{not json"), "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := guest.Open(tc.meta)
			if err != nil {
				t.Fatal(err)
			}
			st.CloseWrite(nil)
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			defer rcancel()
			_, err = io.ReadAll(readerCtx{rctx, st})
			if tc.wantReset {
				if !errors.Is(err, channel.ErrReset) {
					t.Fatalf("want a reset, got %v", err)
				}
				return
			}
			if err != nil || string(st.Status()) != tc.wantStatus {
				t.Fatalf("status %q err %v", st.Status(), err)
			}
		})
	}
	if cmd := <-got; cmd != "x" {
		t.Fatalf("handler saw %q", cmd)
	}
}

type readerCtx struct {
	ctx context.Context
	st  *channel.Stream
}

func (r readerCtx) Read(p []byte) (int, error) { return r.st.ReadContext(r.ctx, p) }

// TestTransferLimitsAndStalls: a transfer past its limit fails and says
// so; one that makes no progress is cancelled after its stall timeout.
func TestTransferLimitsAndStalls(t *testing.T) {
	c, m := boot(t, fake.Faults{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.WaitUp(ctx)
	cases := []struct {
		name    string
		size    int
		max     int64
		wantErr bool
	}{
		{"under", 10, 11, false},
		{"at", 11, 11, false},
		{"over", 12, 11, true},
		{"unlimited", 100000, 0, false},
	}
	for _, tc := range cases {
		t.Run("put "+tc.name, func(t *testing.T) {
			_, err := c.Put(ctx, strings.NewReader(strings.Repeat("p", tc.size)), 0o644, "/p-"+tc.name, tc.max)
			if (err != nil) != tc.wantErr || tc.wantErr && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("put of %d bytes, limit %d: %v", tc.size, tc.max, err)
			}
			if _, stored := m.File("/p-" + tc.name); stored == tc.wantErr {
				t.Fatalf("guest file stored=%v after err=%v", stored, err)
			}
		})
		t.Run("get "+tc.name, func(t *testing.T) {
			if _, err := c.Put(ctx, strings.NewReader(strings.Repeat("g", tc.size)), 0o644, "/g-"+tc.name, 0); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			_, err := c.Get(ctx, "/g-"+tc.name, &got, tc.max)
			if (err != nil) != tc.wantErr || tc.wantErr && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("get of %d bytes, limit %d: %v", tc.size, tc.max, err)
			}
		})
	}

	c.StallTimeout = 200 * time.Millisecond
	m.Freeze() // the guest stops answering
	start := time.Now()
	_, err := c.Get(ctx, "/g-under", io.Discard, 0)
	if err == nil || !strings.Contains(err.Error(), "no progress") || time.Since(start) > 3*time.Second {
		t.Fatalf("a stalled get: %v after %s", err, time.Since(start))
	}
}
