package session

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/snapshot"
)

// recorder is a component that records what the session asked of it.
type recorder struct {
	name     string
	version  int
	required bool
	busy     error
	restored []string
}

func (r *recorder) Name() string     { return r.name }
func (r *recorder) Version() int     { return r.version }
func (r *recorder) Required() bool   { return r.required }
func (r *recorder) Quiescent() error { return r.busy }
func (r *recorder) Freeze()          {}
func (r *recorder) Thaw()            {}
func (r *recorder) Save(kind snapshot.Kind) (json.RawMessage, error) {
	return json.RawMessage(`{"of":"` + r.name + `","kind":"` + string(kind) + `"}`), nil
}
func (r *recorder) Restore(v int, data json.RawMessage) error {
	r.restored = append(r.restored, string(data))
	return nil
}

func TestComponentsCheck(t *testing.T) {
	sec := func(v int) snapshot.Section { return snapshot.Section{Version: v, Data: json.RawMessage(`{}`)} }
	comps := components{
		&recorder{name: "channel", version: 1, required: true},
		&recorder{name: "netstack", version: 2},
	}
	cases := []struct {
		name     string
		sections map[string]snapshot.Section
		want     string // "" = accepted
	}{
		{"all present", map[string]snapshot.Section{"engine": sec(1), "channel": sec(1), "netstack": sec(2)}, ""},
		{"older optional section", map[string]snapshot.Section{"engine": sec(1), "channel": sec(1), "netstack": sec(1)}, ""},
		// An artifact from before a component existed restores; the
		// component starts fresh.
		{"optional section absent", map[string]snapshot.Section{"engine": sec(1), "channel": sec(1)}, ""},
		{"required section absent", map[string]snapshot.Section{"engine": sec(1)}, `no "channel" section`},
		{"unknown section", map[string]snapshot.Section{"engine": sec(1), "channel": sec(1), "disks": sec(1)}, `needs a "disks" section`},
		{"newer section", map[string]snapshot.Section{"engine": sec(1), "channel": sec(1), "netstack": sec(3)}, `"netstack" section is version 3; this nether reads up to 2`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := comps.check(tc.sections)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("check: %v, want %q", err, tc.want)
			}
		})
	}
}

func TestComponentsSaveRestoreQuiescent(t *testing.T) {
	a, b := &recorder{name: "a", version: 1}, &recorder{name: "b", version: 4}
	comps := components{a, b}
	out := map[string]snapshot.Section{}
	if err := comps.save(out, snapshot.KindPark); err != nil {
		t.Fatal(err)
	}
	if out["b"].Version != 4 || string(out["a"].Data) != `{"of":"a","kind":"park"}` {
		t.Fatalf("saved %v", out)
	}
	delete(out, "b")
	if err := comps.restore(out); err != nil {
		t.Fatal(err)
	}
	if a.restored[0] != `{"of":"a","kind":"park"}` || b.restored[0] != "" {
		t.Fatalf("restored a=%q b=%q (b had no section: want nil data)", a.restored, b.restored)
	}
	b.busy = errors.New("2 flows open")
	if err := comps.quiescent(); err == nil || !strings.Contains(err.Error(), "2 flows open") {
		t.Fatalf("quiescent: %v", err)
	}
}

// ringHolder is a component that holds bytes for the guest on the host
// side, as a plane bridge's ring does.
type ringHolder struct {
	recorder
	undrained error
}

func (r *ringHolder) Drained() error { return r.undrained }

// TestComponentsDrained: the drain gate asks only the components that can
// hold bytes, and names the one that does.
func TestComponentsDrained(t *testing.T) {
	ring := &ringHolder{recorder: recorder{name: "bridge", version: 1}}
	comps := components{&recorder{name: "channel", version: 1}, ring}
	if err := comps.drained(); err != nil {
		t.Fatalf("drained with nothing held: %v", err)
	}
	ring.undrained = errors.New("4096 bytes for the guest")
	if err := comps.drained(); err == nil || !strings.Contains(err.Error(), "bridge: 4096 bytes") {
		t.Fatalf("drained: %v", err)
	}
}

func TestConsoleComponent(t *testing.T) {
	t.Run("round trip", func(t *testing.T) {
		var got bytes.Buffer
		save := &consoleComponent{tail: func() []byte { return []byte("login: \x1b[1mhi\x1b[0m\r\n") }}
		data, err := save.Save(snapshot.KindBase)
		if err != nil {
			t.Fatal(err)
		}
		load := &consoleComponent{term: func() io.Writer { return &got }}
		if err := load.Restore(1, data); err != nil {
			t.Fatal(err)
		}
		if got.String() != "login: \x1b[1mhi\x1b[0m\r\n" {
			t.Fatalf("replayed %q", got.String())
		}
	})
	t.Run("saves at most the bound", func(t *testing.T) {
		save := &consoleComponent{tail: func() []byte { return bytes.Repeat([]byte("x"), 3*consoleSectionMax) }}
		data, err := save.Save(snapshot.KindBase)
		if err != nil {
			t.Fatal(err)
		}
		var sec consoleSection
		if err := json.Unmarshal(data, &sec); err != nil || len(sec.Tail) != consoleSectionMax {
			t.Fatalf("saved %d bytes (%v), want %d", len(sec.Tail), err, consoleSectionMax)
		}
	})
	t.Run("refuses an oversized section", func(t *testing.T) {
		data, _ := json.Marshal(consoleSection{Tail: make([]byte, consoleSectionMax+1)})
		if err := (&consoleComponent{}).Restore(1, data); err == nil {
			t.Fatal("an oversized console section was accepted")
		}
	})
	t.Run("refuses garbage", func(t *testing.T) {
		if err := (&consoleComponent{}).Restore(1, json.RawMessage(`{"tail": 5}`)); err == nil {
			t.Fatal("a malformed console section was accepted")
		}
	})
	t.Run("absent section is fine", func(t *testing.T) {
		if err := (&consoleComponent{}).Restore(0, nil); err != nil {
			t.Fatal(err)
		}
	})
}
