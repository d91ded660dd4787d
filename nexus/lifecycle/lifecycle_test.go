package lifecycle

import (
	"errors"
	"strings"
	"testing"
)

// TestTable is the whole table, legal and illegal, as the README documents it.
func TestTable(t *testing.T) {
	legal := map[State]map[Verb]State{
		Created: {Start: Running, Remove: Removed, RemoveF: Removed},
		Running: {Stop: Stopped, Pause: Paused, Snapshot: Running, RemoveF: Removed},
		Stopped: {Start: Running, Snapshot: Stopped, Remove: Removed, RemoveF: Removed},
		Paused:  {Resume: Running, Remove: Removed, RemoveF: Removed},
		Error:   {Remove: Removed, RemoveF: Removed},
	}
	for _, st := range States() {
		for _, v := range Verbs() {
			t.Run(string(st)+"/"+string(v), func(t *testing.T) {
				to, err := Next("sb1", st, v)
				want, ok := legal[st][v]
				if ok {
					if err != nil || to != want {
						t.Fatalf("Next(%s, %s) = %s, %v; want %s", st, v, to, err, want)
					}
					return
				}
				var ite *IllegalTransitionError
				if !errors.As(err, &ite) || ite.Sandbox != "sb1" || ite.State != st || ite.Verb != v {
					t.Fatalf("Next(%s, %s) = %s, %v; want an IllegalTransitionError", st, v, to, err)
				}
				if !strings.Contains(err.Error(), "sandbox sb1 is "+string(st)) {
					t.Fatalf("message %q does not name the sandbox and its state", err)
				}
			})
		}
	}
}

func TestFailFromAnywhere(t *testing.T) {
	for _, st := range States() {
		if to, err := Next("x", st, Fail); err != nil || to != Error {
			t.Errorf("%s -> fail = %s, %v", st, to, err)
		}
	}
}

func TestMessages(t *testing.T) {
	_, err := Next("web", Running, Remove)
	if !strings.Contains(err.Error(), "rm --force") {
		t.Errorf("rm of a running sandbox: %v", err)
	}
	_, err = Next("web", Running, Fork)
	if !strings.Contains(err.Error(), "use nexus fork") {
		t.Errorf("fork as a transition: %v", err)
	}
}
