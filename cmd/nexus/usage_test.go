package main

import (
	"context"
	"io"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/nexus"
	"github.com/nethersandbox/nether/nexus/lifecycle"
)

// TestUsageErrors: bad usage exits 2 and names what was wrong in words, a
// mistyped command included (cobra reports it as a plain string).
func TestUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want []string
		not  string
	}{
		{[]string{"snapshots"}, []string{`unknown command "snapshots"`, "snapshot"}, ""},
		{[]string{"fork", "-n", "2x", "base"}, []string{`-n, --n "2x": want a whole number`}, "strconv"},
		{[]string{"create", "--cpus", "many"}, []string{`--cpus "many": want a whole number`}, "strconv"},
		{[]string{"rm", "--force=maybe", "web"}, []string{`--force "maybe": want true or false`}, "strconv"},
		{[]string{"ls", "--bogus"}, []string{"unknown flag: --bogus"}, ""},
		{[]string{"exec", "web"}, []string{"exec takes a sandbox and a command"}, ""},
	} {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			a := &app{stateDir: t.TempDir()}
			root := a.commands()
			root.SetArgs(tt.args)
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			err := root.ExecuteContext(context.Background())
			if err == nil {
				t.Fatal("no error")
			}
			if code := exitCode(err); code != exitUsage {
				t.Errorf("exit %d, want %d (%v)", code, exitUsage, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q lacks %q", err, w)
				}
			}
			if tt.not != "" && strings.Contains(err.Error(), tt.not) {
				t.Errorf("%q says %q", err, tt.not)
			}
		})
	}
}

// TestNote: ls says why a sandbox is in error or last stopped, or which
// pool (by name) holds it.
func TestNote(t *testing.T) {
	names := names{"01JSNAPSNAPSNAPSNAPSNAPSNA": "warm"}
	for _, tc := range []struct {
		sb   nexus.Sandbox
		want string
	}{
		{nexus.Sandbox{State: lifecycle.Stopped, Final: "[nether] final usage (reason=max_runtime): uptime_ms=5003"}, "last stop: max_runtime"},
		{nexus.Sandbox{State: lifecycle.Paused, Final: "[nether] final usage (reason=park): uptime_ms=1"}, "last stop: park"},
		{nexus.Sandbox{State: lifecycle.Running, Final: "[nether] final usage (reason=shutdown): uptime_ms=1"}, ""},
		{nexus.Sandbox{State: lifecycle.Error, Reason: "its nether ended without a final record"}, "its nether ended without a final record"},
		{nexus.Sandbox{State: lifecycle.Running, Pool: "01JSNAPSNAPSNAPSNAPSNAPSNA"}, "pool of warm"},
		{nexus.Sandbox{State: lifecycle.Running, Pool: "01JOTHEROTHEROTHEROTHEROTH"}, "pool of 01JOTHEROTHEROTH"},
	} {
		if got := note(&tc.sb, names); got != tc.want {
			t.Errorf("note(%+v) = %q, want %q", tc.sb, got, tc.want)
		}
	}
}
