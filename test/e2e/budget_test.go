package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestBudgets: each govern budget ends a real sandbox (a fork of the shared
// base, so its budgets count from its restore) through the normal
// teardown, with its reason in the final record, within about a second of
// its limit; a command in flight gets the stop's ERR before its client is
// closed.
func TestBudgets(t *testing.T) {
	needGuest(t)
	base := sharedBase(t)
	cases := []struct {
		name   string
		conf   string
		drive  func(t *testing.T, sb *sandbox) time.Time // returns when the limit is reached
		reason string
	}{
		{"max_runtime mid-command", "max_runtime_s = 4", func(t *testing.T, sb *sandbox) time.Time {
			raw := rawDial(t, sb.sock)
			raw.send(t, "echo started; sleep 60")
			body, exit, err := raw.reply(30 * time.Second)
			if err != nil || exit != -1 || !strings.Contains(body, "started\n") || !strings.Contains(body, "ERR sandbox stopping: max_runtime") {
				t.Errorf("the command in flight: %q exit %d err %v", body, exit, err)
			}
			return sb.h.Started.Add(4 * time.Second)
		}, "max_runtime"},
		{"max_cpu under a busy guest", "max_cpu_s = 3", func(t *testing.T, sb *sandbox) time.Time {
			raw := rawDial(t, sb.sock)
			raw.send(t, "while :; do :; done")
			body, exit, err := raw.reply(60 * time.Second)
			if err != nil || exit != -1 || !strings.Contains(body, "ERR sandbox stopping: max_cpu") {
				t.Errorf("the busy loop: %q exit %d err %v", body, exit, err)
			}
			return time.Now()
		}, "max_cpu"},
		{"idle once the client leaves", "idle_timeout_s = 2", func(t *testing.T, sb *sandbox) time.Time {
			c := sb.dial()
			if info := mustRun(t, c, "__info__"); !strings.Contains(info, "idle_timeout_s=2\n") {
				t.Errorf("__info__ does not report idle_timeout_s=2:\n%s", info)
			}
			time.Sleep(3 * time.Second) // a connected client holds it awake
			if sb.h.Exited() {
				t.Fatal("the sandbox went idle with a client connected")
			}
			c.Close()
			return time.Now().Add(2 * time.Second)
		}, "idle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := forkOf(t, base, tc.conf)
			limit := tc.drive(t, sb)
			line := sb.wait(30 * time.Second)
			if got := reasonOf(line); got != tc.reason {
				t.Fatalf("final record %q, want reason=%s", line, tc.reason)
			}
			if late := time.Since(limit); late > 3*time.Second {
				t.Errorf("ended %s after its limit", late.Round(time.Millisecond))
			}
			t.Logf("%s: ended %s after its limit", tc.name, time.Since(limit).Round(time.Millisecond))
		})
	}
}
