package control

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nethersandbox/nether/internal/cmdline"
)

// servedNames is what this build serves, as the protocol and the brief
// for this build define it. Changing what nether serves means changing
// this list, the handlers and, for a new verb, cmdline's table.
var servedNames = []string{
	"__info__", "__stats__", "__help__", "__put__", "__get__",
	"__shutdown__", "__snapshot__", "__park__", cmdline.Shell,
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
	for _, sp := range set.Specs() {
		if sp.Access == cmdline.PrimaryOnly && !handlers[sp.Name].queued {
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
			h := start(t, fb, 0, nil)
			primary := h.dial(t)
			primary.roundTrip("__info__") // admitted first: the primary
			observer := h.dial(t)
			line := exampleLine(sp)

			got := observer.roundTrip(line)
			refused := strings.HasPrefix(got, "ERR read-only observer: ") && strings.HasSuffix(got, "\x1e-1\n")
			if refused != (sp.Access == cmdline.PrimaryOnly) {
				t.Fatalf("observer %q: %q; the table says %v", line, trunc(got), sp.Access)
			}
			if sp.Reply != cmdline.Framed {
				t.Skip("no served command is streamed yet")
			}
			primary.send(line)
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
