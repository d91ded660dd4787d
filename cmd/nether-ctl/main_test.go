package main

import (
	"bufio"
	"bytes"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nethersandbox/nether/internal/frame"
)

func fakeNether(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "n.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return
					}
					switch line = strings.TrimSpace(line); line {
					case "__info__":
						c.Write(frame.Framed("proto_version=2\nmax_output_bytes=4", 0))
					case "exit 3":
						c.Write([]byte("out\x1f^put\n\x1e3\n"))
					case "__bogus__":
						c.Write(frame.Framed("ERR unknown command __bogus__", -1))
					default:
						c.Write(frame.Framed("echo:"+line, 0))
					}
				}
			}()
		}
	}()
	return sock
}

func TestRun(t *testing.T) {
	sock := fakeNether(t)
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
