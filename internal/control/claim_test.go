package control

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

// __claim__ is a framed primary-only command whose reply is the
// backend's: OK on success, ERR claim: <why> on one line otherwise. It
// reaches the backend without waiting for the agent (the session says
// whether a restore has finished), and an observer never reaches it.
func TestClaimCommand(t *testing.T) {
	fb := newFake() // the agent never comes up
	h := start(t, fb, 0, nil)
	c := h.dial(t)
	cases := []struct{ name, line, want string }{
		{"success", "__claim__ user-1 host-1", "OK claimed user-1 host-1\n\x1e0\n"},
		// The backend's reason goes out on one line, whatever it holds.
		{"refused", "__claim__ fail host-2", "ERR claim: only a fork of a base can be claimed; this sandbox booted\n\x1e-1\n"},
		{"one argument", "__claim__ user-3", "ERR __claim__ takes 2 to 6 arguments (<sandbox_id> <hostname> [node_id=ID] [boot_id=ID] [plan_digest=HEX] [token=T]), got 1\n\x1e-1\n"},
		{"boot identity", "__claim__ user-5 host-5 boot_id=B1 token=t.s", "OK claimed user-5 host-5\n\x1e0\n"},
		{"unknown key", "__claim__ user-6 host-6 secret=x", "ERR claim: unknown claim key \"secret\" (want node_id, boot_id, plan_digest, token)\n\x1e-1\n"},
		{"not key=value", "__claim__ user-7 host-7 B1", "ERR claim: \"B1\": want key=value (node_id, boot_id, plan_digest, token)\n\x1e-1\n"},
		{"twice", "__claim__ user-8 host-8 boot_id=a boot_id=b", "ERR claim: boot_id given twice\n\x1e-1\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.roundTrip(tc.line); got != tc.want {
				t.Fatalf("got %q want %q", got, tc.want)
			}
		})
	}
	t.Run("an observer is refused before the backend", func(t *testing.T) {
		o := h.dial(t)
		if got := o.roundTrip("__claim__ user-4 host-4"); !strings.HasPrefix(got, "ERR read-only observer: __claim__ needs the primary client") {
			t.Fatalf("observer claim: %q", got)
		}
	})
	fb.mu.Lock()
	got := slices.Clone(fb.captures)
	fb.mu.Unlock()
	if want := []string{"claim user-1 host-1", "claim fail host-2", "claim user-5 host-5 B1"}; !slices.Equal(got, want) {
		t.Fatalf("the backend was asked %q, want %q", got, want)
	}
	if n := fb.waitCalls.Load(); n != 0 {
		t.Fatalf("a claim waited for the agent (%d WaitAgent calls)", n)
	}
}

// A claim in progress is never cancelled from the control side: not by
// its client leaving, not by Stop (which answers it). Half a claim leaves
// a guest whose identity the host does not know, so only the session,
// through the root context, may give up on one.
func TestClaimLeftToTheSession(t *testing.T) {
	t.Run("its client leaves", func(t *testing.T) {
		fb, h, c := blockedCall(t, "__claim__ user-1 host-1", "Claim", false, nil)
		c.c.Close()
		waitFor(t, "the server to drop the client", 5*time.Second, func() bool {
			h.s.mu.Lock()
			defer h.s.mu.Unlock()
			return len(h.s.clients) == 0
		})
		if ctx := fb.contexts("Claim")[0]; ctx.Err() != nil {
			t.Fatalf("the client leaving cancelled the claim: %v", context.Cause(ctx))
		}
		h.cancel()
	})
	t.Run("the server stops", func(t *testing.T) {
		fb, h, c := blockedCall(t, "__claim__ user-1 host-1", "Claim", false, nil)
		took := h.stopAsync("sigterm")
		if got := c.nextReply(5 * time.Second); got != stopSigterm {
			t.Fatalf("the claim: %q, want %q", got, stopSigterm)
		}
		c.closedAfter(5 * time.Second)
		waitStopped(t, took, 5*time.Second)
		ctx := fb.contexts("Claim")[0]
		if ctx.Err() != nil {
			t.Fatal("Stop cancelled the claim")
		}
		h.cancel()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the claim's context does not end with the root context")
		}
	})
}
