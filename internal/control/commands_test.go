package control

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/cmdline"
	"github.com/nethersandbox/nether/internal/cmdlog"
	"github.com/nethersandbox/nether/internal/framebuf"
	"github.com/nethersandbox/nether/internal/netlog"
	"github.com/nethersandbox/nether/internal/timeline"
)

// servedNames is what this build serves, as the protocol and the brief
// for this build define it. Changing what nether serves means changing
// this list, the handlers and, for a new verb, cmdline's table.
var servedNames = []string{
	"__info__", "__stats__", "__help__", "__put__", "__get__",
	"__shutdown__", "__snapshot__", "__park__", "__claim__", cmdline.Shell,
	"__events__", "__cmdlog__", "__netlog__", "__screen__", "__screendiff__", "__frame__", "__framediff__",
}

// Every handler is attached to an entry of cmdline's table and every
// served entry has a handler: the two cannot drift apart.
func TestHandlersMatchTable(t *testing.T) {
	set, err := servedSet()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sp := range set.Specs() {
		got = append(got, sp.Name)
		if _, ok := handlers[sp.Name]; !ok {
			t.Errorf("served entry %q has no handler", sp.Name)
		}
	}
	for name := range handlers {
		if _, ok := cmdline.Lookup(name); !ok {
			t.Errorf("handler %q is for a verb cmdline's table does not have", name)
		}
		if _, ok := set.Lookup(name); !ok {
			t.Errorf("handler %q is not served", name)
		}
	}
	want := slices.Clone(servedNames)
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("this build serves %q, want %q", got, want)
	}
	// Queries run from the reader, so nothing that drives the guest may
	// be one: a primary-only command is always queued work.
	// The diff commands are primary-only because the protocol keeps their
	// state for one client, not because they drive anything: they read.
	readsOnly := map[string]bool{"__screendiff__": true, "__framediff__": true}
	for _, sp := range set.Specs() {
		if sp.Access == cmdline.PrimaryOnly && !handlers[sp.Name].queued() && !readsOnly[sp.Name] {
			t.Errorf("%q drives the sandbox but is not queued", sp.Usage())
		}
	}
}

// __help__ lists exactly what this build serves, with the table's tags.
func TestHelpListsServed(t *testing.T) {
	fb := newFake()
	h := start(t, fb, 0, nil)
	got := h.dial(t).roundTrip("__help__")
	body, ok := strings.CutSuffix(got, "\x1e0\n")
	if !ok {
		t.Fatalf("__help__ is not a framed exit-0 reply: %q", got)
	}
	lines := strings.Split(strings.TrimSuffix(body, "\n"), "\n")
	if lines[0] != "proto_version=2" {
		t.Fatalf("first line %q", lines[0])
	}
	var listed []string
	for _, l := range lines[1:] {
		usage := strings.Fields(l)[0]
		if usage == "<anything" {
			usage = cmdline.Shell
		}
		listed = append(listed, usage)
		sp, _ := cmdline.Lookup(usage)
		if primary := strings.Contains(l, "[primary only"); primary != (sp.Access == cmdline.PrimaryOnly) {
			t.Errorf("help line %q: primary-only tag %v, table says %v", l, primary, sp.Access)
		}
	}
	want := slices.Clone(servedNames)
	slices.Sort(want)
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		t.Fatalf("__help__ lists %q, want %q", listed, want)
	}
}

// exampleLine is a valid line for a table entry: the minimum number of
// arguments the entry takes.
func exampleLine(sp cmdline.Spec) string {
	if sp.Name == cmdline.Shell {
		return "echo example"
	}
	line := sp.Name
	for i := 0; i < sp.Args.Min; i++ {
		line += " arg" + string(rune('a'+i))
	}
	return line
}

// Every served command follows its table entry: an observer is refused a
// primary-only one and answered an any-client one, and the reply is
// framed when the table says so.
func TestServedCommandsFollowTable(t *testing.T) {
	set, err := servedSet()
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range set.Specs() {
		t.Run(sp.Usage(), func(t *testing.T) {
			fb := newFake()
			fb.up()
			fb.display = &framebuf.Image{Width: 4, Height: 2, Pix: make([]byte, 4*2*3)}
			h := start(t, fb, 0, func(s *Server) {
				s.Observe = Observe{Events: timeline.New(time.Now(), nil, 0), Commands: cmdlog.New(0), Flows: netlog.New(0)}
			})
			primary := h.dial(t)
			primary.roundTrip("__info__") // admitted first: the primary
			observer := h.dial(t)
			line := exampleLine(sp)

			var got string
			if sp.Reply == cmdline.Streamed {
				observer.send(line)
				got = observer.readStreamed()
			} else {
				got = observer.roundTrip(line)
			}
			refused := strings.HasPrefix(got, "ERR read-only observer: ") && strings.HasSuffix(got, "\x1e-1\n")
			if refused != (sp.Access == cmdline.PrimaryOnly) {
				t.Fatalf("observer %q: %q; the table says %v", line, trunc(got), sp.Access)
			}
			primary.send(line)
			if sp.Reply == cmdline.Streamed {
				if got := primary.readStreamed(); strings.HasPrefix(got, "ERR") {
					t.Fatalf("primary %q: %q", line, trunc(got))
				}
				return
			}
			body, exit, err := primary.tryFrame(5 * time.Second)
			if err != nil {
				t.Fatalf("primary %q: no framed reply: %v (body %q)", line, err, body)
			}
			if exit != "0" {
				t.Fatalf("primary %q: exit %s, body %q", line, exit, body)
			}
		})
	}
}

// The root context passed to Serve: Backend calls and client waits derive
// from it, and cancelling it stops the server accepting.
func TestRootContext(t *testing.T) {
	t.Run("Serve returns when ctx ends", func(t *testing.T) {
		h := start(t, newFake(), 0, nil)
		h.dial(t).roundTrip("__info__")
		h.cancel()
		select {
		case <-h.served:
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return after its context was cancelled")
		}
		c, err := net.DialTimeout("unix", h.path, time.Second)
		if err == nil {
			c.Close()
			t.Fatal("the socket still accepts connections after the root context ended")
		}
	})

	t.Run("Backend calls derive from it", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, nil)
		c := h.dial(t)
		for _, line := range []string{"echo x", "__put__ a b", "__get__ a b", "__snapshot__ s", "__park__ p", "__claim__ a b"} {
			if got := c.roundTrip(line); !strings.HasSuffix(got, "\x1e0\n") {
				t.Fatalf("%q: %q", line, got)
			}
		}
		// Each call's context is released when its command ends, so
		// being done proves nothing; carrying the root's value does.
		for _, m := range []string{"WaitAgent", "Exec", "Put", "Get", "Snapshot", "Park", "Claim"} {
			ctxs := fb.contexts(m)
			if len(ctxs) == 0 {
				t.Fatalf("%s was never called", m)
			}
			for i, ctx := range ctxs {
				if ctx.Value(rootKey{}) != h.ctx.Value(rootKey{}) {
					t.Errorf("%s call %d: its context does not derive from Serve's", m, i)
				}
			}
		}
	})

	t.Run("a command waiting for the agent is released", func(t *testing.T) {
		fb := newFake() // the agent never connects
		h := start(t, fb, 0, func(s *Server) { s.AgentWait = time.Minute })
		c := h.dial(t)
		c.send("echo waits")
		waitFor(t, "the command to wait for the agent", 5*time.Second, func() bool { return fb.waitCalls.Load() == 1 })
		h.cancel()
		body, exit := c.readFrame(5 * time.Second)
		if got := framed(string(body), exit); got != "ERR nether is stopping\n\x1e-1\n" {
			t.Fatalf("the waiting command: %q", got)
		}
		if n := fb.execCount(); n != 0 {
			t.Fatalf("Exec ran %d times after the session ended", n)
		}
	})

	t.Run("a running command ends with nether's ERR", func(t *testing.T) {
		fb := newFake()
		fb.up()
		h := start(t, fb, 0, nil)
		gate := make(chan struct{}) // never opened: only ctx ends the wait
		fb.on("long", script{chunks: [][]byte{[]byte("start\n"), []byte("never")}, gate: gate, gateAt: 1, status: "0"})
		c := h.dial(t)
		c.send("long")
		c.readUntil("start\n", 5*time.Second)
		h.cancel()
		body, exit := c.readFrame(5 * time.Second)
		if got := framed(string(body), exit); got != "\nERR exec: cancelled: nether is stopping\n\x1e-1\n" {
			t.Fatalf("the running command: %q", got)
		}
	})

	t.Run("queued work is not started after it ends", func(t *testing.T) {
		fb := newFake()
		fb.up()
		fb.block = true // Put blocks until its context ends
		h := start(t, fb, 0, nil)
		c := h.dial(t)
		c.send("__put__ a b")
		c.send("echo queued")
		waitFor(t, "Put to start", 5*time.Second, func() bool { return fb.putCalls.Load() == 1 })
		h.cancel()
		for i, want := range []string{"ERR put: context canceled\n\x1e-1\n", "ERR nether is stopping\n\x1e-1\n"} {
			body, exit := c.readFrame(5 * time.Second)
			if got := framed(string(body), exit); got != want {
				t.Fatalf("reply %d: %q, want %q", i, got, want)
			}
		}
		if n := fb.execCount(); n != 0 {
			t.Fatalf("queued work ran after the session ended (%d execs)", n)
		}
		if !errors.Is(fb.contexts("Put")[0].Err(), context.Canceled) {
			t.Fatal("Put's context was not cancelled")
		}
	})
}
