package e2e

// A session always ends: with its engine frozen, during a restore, or
// killed outright. These tests restore from the shared base, so each
// costs a restore, not a cold boot (except the one SIGKILL case that is
// about a boot).

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nethersandbox/nether/client"
)

// TestFrozenQEMU: a sandbox whose QEMU is frozen (SIGSTOP) still ends
// promptly, with exactly one final record, whether a signal or a client
// stops it.
func TestFrozenQEMU(t *testing.T) {
	art := sharedBase(t)
	cases := []struct {
		name   string
		stop   func(t *testing.T, sb *sandbox, c *client.Client)
		within time.Duration
		reason string
	}{
		{"SIGTERM", func(t *testing.T, sb *sandbox, c *client.Client) {
			sb.h.Signal(syscall.SIGTERM)
		}, 10 * time.Second, "sigterm"},
		{"__shutdown__", func(t *testing.T, sb *sandbox, c *client.Client) {
			if body, exit := run(t, c, "__shutdown__"); body != "OK shutting down\n" || exit != 0 {
				t.Errorf("__shutdown__ to a frozen guest: %q exit %d, want OK shutting down, exit 0", body, exit)
			}
		}, 15 * time.Second, "shutdown"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := forkOf(t, art)
			c := sb.dial()
			mustRun(t, c, "true") // restored and driveable
			freeze(t, sb.qemu())
			began := time.Now()
			tc.stop(t, sb, c)
			line := sb.wait(tc.within)
			t.Logf("%s with QEMU frozen: nether ended %s later", tc.name, time.Since(began).Round(time.Millisecond))
			if want := "[nether] final usage (reason=" + tc.reason + "): "; !strings.HasPrefix(line, want) {
				t.Errorf("final record %q, want it to start %q", line, want)
			}
			if code := sb.h.ExitCode(); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			sb.checkNoLeftovers()
		})
	}
}

// TestFrozenQEMUDuringRestore: a fork whose QEMU is frozen the moment it
// appears (so the restore cannot finish) still ends on SIGTERM within
// 10 s, with one final record, leaving nothing behind.
func TestFrozenQEMUDuringRestore(t *testing.T) {
	art := sharedBase(t)
	for _, delay := range []time.Duration{0, time.Second} {
		t.Run("SIGTERM "+delay.String()+" after the freeze", func(t *testing.T) {
			sb := spawn(t, t.TempDir(), "restore = 1", "restore_from = "+art)
			q, err := sb.h.WaitMachine(30*time.Second, time.Millisecond)
			if err != nil {
				t.Fatalf("%v\nstderr:\n%s", err, sb.stderr.String())
			}
			freeze(t, q)
			t.Logf("froze %s", q)
			time.Sleep(delay)
			if sb.h.Exited() {
				t.Fatalf("nether exited by itself while its QEMU was frozen: %s", sb.stdout.String())
			}
			began := time.Now()
			sb.h.Signal(syscall.SIGTERM)
			line := sb.wait(10 * time.Second)
			t.Logf("SIGTERM during a frozen restore: nether ended %s later", time.Since(began).Round(time.Millisecond))
			if !strings.HasPrefix(line, "[nether] final usage (reason=sigterm): ") {
				t.Errorf("final record %q, want reason=sigterm", line)
			}
			if code := sb.h.ExitCode(); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			sb.checkNoLeftovers()
		})
	}
}

// TestSIGKILLLeavesNothing: a nether killed outright, once its guest
// runs, leaves no process (QEMU dies by PDEATHSIG), nothing in its
// TMPDIR, nothing in /dev/shm and no temporary file in the launch
// directory. Only the socket file may stay (the next nether replaces it).
func TestSIGKILLLeavesNothing(t *testing.T) {
	cases := []struct {
		name  string
		start func(t *testing.T) *sandbox
	}{
		{"boot", func(t *testing.T) *sandbox { return start(t) }},
		{"fork of a base", func(t *testing.T) *sandbox { return forkOf(t, sharedBase(t)) }},
		{"wake of a park", func(t *testing.T) *sandbox {
			sb := forkOf(t, sharedBase(t))
			if body, exit := run(t, sb.dial(), "__park__ p"); exit != 0 {
				t.Fatalf("__park__: %q exit %d", body, exit)
			}
			sb.wait(30 * time.Second)
			return restoreIn(t, t.TempDir(), sb.dir+"/p")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := tc.start(t)
			c := sb.dial()
			mustRun(t, c, "echo alive > /root/alive")
			q := sb.qemu()
			sb.h.Signal(syscall.SIGKILL)
			if err := sb.h.Wait(10 * time.Second); err != nil {
				t.Fatalf("nether survived SIGKILL: %v", err)
			}
			began := time.Now()
			for q.Alive() {
				if time.Since(began) > 5*time.Second {
					t.Fatalf("QEMU survived nether's SIGKILL by 5 s: %s", q)
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("QEMU gone %s after nether was reaped", time.Since(began).Round(time.Millisecond))
			sb.checkLeftoversAfterKill()
		})
	}
}
