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
		Stopped: {Start: Running, Remove: Removed, RemoveF: Removed},
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

// TestMessages: each refusal says what the sandbox allows, only what it
// allows, and in words that are not one surface's (no CLI flags).
func TestMessages(t *testing.T) {
	for _, tc := range []struct {
		state State
		verb  Verb
		want  []string
		not   []string
	}{
		{Running, Remove, []string{"stop it first, or remove it with force"}, []string{"--force"}},
		{Stopped, Fork, []string{"a fork is made from a running sandbox", "start it, or fork one of its snapshots"}, []string{"transition", "nexus fork"}},
		{Created, Fork, []string{"sandbox web is created", "a fork is made from a running sandbox"}, nil},
		{Stopped, Snapshot, []string{"no memory to capture", "start it"}, nil},
		{Stopped, Verb("exec"), []string{"exec is not allowed", "a stopped sandbox allows: rm, rm --force, start"}, []string{"snapshot"}},
		{Paused, Stop, []string{"a paused sandbox allows: resume, rm, rm --force"}, nil},
	} {
		t.Run(string(tc.state)+"/"+string(tc.verb), func(t *testing.T) {
			_, err := Next("web", tc.state, tc.verb)
			if err == nil {
				t.Fatal("allowed")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(err.Error(), w) {
					t.Errorf("%q says %q", err, w)
				}
			}
		})
	}
	// Every verb a refusal lists is one the table allows.
	for _, st := range States() {
		for _, v := range Allowed(st) {
			if _, err := Next("x", st, v); err != nil {
				t.Errorf("%s lists %s as allowed, but the table refuses it: %v", st, v, err)
			}
		}
	}
}
