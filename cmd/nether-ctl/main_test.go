package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/controltest"
	"github.com/nethersandbox/nether/internal/frame"
)

// fakeNether answers a few lines the way nether would, and echoes any
// other line back framed, so a test can see the line nether-ctl sent.
func fakeNether(t *testing.T) string {
	t.Helper()
	return controltest.Server{
		Info: "proto_version=2\nmax_output_bytes=4",
		Handle: controltest.Replies(map[string][]byte{
			"exit 3":    []byte("out\x1f^put\n\x1e3\n"),
			"__bogus__": frame.Framed("ERR unknown command __bogus__", -1),
		}, func(line string) []byte { return frame.Framed("echo:"+line, 0) }),
	}.Start(t)
}

func TestRun(t *testing.T) {
	sock := fakeNether(t)
	refusing := controltest.Server{Refuse: frame.Framed("ERR too many clients (limit 16)", -1)}.Start(t)
	tests := []struct {
		name       string
		args       []string
		exit       int
		stdout     string
		stderrPart string
	}{
		{"guest exit propagates", []string{sock, "exit", "3"}, 3, "out\x1eput\n", ""},
		{"args joined", []string{"-timeout", "5s", sock, "ls", "-la", "/tmp"}, 0, "echo:ls -la /tmp\n", ""},
		{"control error", []string{sock, "__bogus__"}, exitFailure, "", "ERR unknown command __bogus__\n"},
		{"refused at connect", []string{refusing, "__info__"}, exitFailure, "", "ERR too many clients (limit 16)\n"},
		{"missing socket", []string{filepath.Join(t.TempDir(), "x.sock"), "__info__"}, exitFailure, "", "is nether running with control_socket= set?"},
		{"no command", []string{sock}, exitFailure, "", "need a socket path and a command"},
		{"bad flag", []string{"-bogus", sock, "ls"}, exitFailure, "", "--help"},
		{"help", []string{"--help"}, 0, usage, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			exit := run(tt.args, &stdout, &stderr)
			if exit != tt.exit || stdout.String() != tt.stdout || !strings.Contains(stderr.String(), tt.stderrPart) {
				t.Fatalf("exit %d stdout %q stderr %q", exit, stdout.String(), stderr.String())
			}
		})
	}
}
